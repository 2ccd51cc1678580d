"""What the node keeps on disk, versioned and tolerant of older and newer formats.

Each fact has one home, and the reason it is there:

- checkpoint.json (checkpoint/, records.py): which claims are prepared, and what each was
  given (its devices, CDI IDs, the partition and the sharing set up for it). The truth
  for answering the kubelet and for rebuilding a claim's CDI spec after a reboot. Saved
  after the step it records, atomically.
- mig-mode.json (mig_ledger.py), sharing-ledger.json (sharing_ledger.py) and imex/<daemon>/
  (hardware/imex.py): what the driver changed on the hardware or started on the node
  (a MIG mode switched, a MIG instance carved, a compute mode or interval set, an MPS or
  IMEX daemon started), each written *before* the change. The truth for undoing it: a
  checkpoint lost or moved aside as corrupt then leaks nothing, and a crash between the
  change and the checkpoint's save leaves it known. Where a claim's record also names
  an instance or a daemon, the record says what the claim was given and the ledger
  what must be undone; an undo asks the ledger.
- device-names.json (name_book.py): which GPU each published device name stood for,
  kept past the GPU itself so that a claim allocated to a name whose GPU is gone is
  refused, not handed another GPU.
- health.json (dradriver/health/store.py): faults seen on each GPU, which NVML reports
  once (an XID event), so that a restart does not forget a GPU is sick.

The rest of the package: journal.py (each hardware step saved before the next),
pod_limits.py (what the prepared shares of each GPU give each pod, pure); share.py,
sharing.py and imex.py (a share's, a sharing setup's and an IMEX channel's part of a
device's record) and decode.py (their typed reading); files.py (atomic writes, the node
lock), gpu_locks.py (per-GPU locks), tidy.py (what an uninstall removes).

Imports no other package of the plugin: everything else builds on it.
"""
