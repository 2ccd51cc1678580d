"""What the node keeps on disk, versioned and tolerant of older and newer formats:

- checkpoint/ and records.py: the prepared claims, typed, with their codec and store;
- mig_ledger.py and sharing_ledger.py: what the driver changed in MIG and in GPU
  sharing, kept apart from the checkpoint so that losing it loses nothing;
- journal.py: each hardware step recorded (an atomic, synced save) before the next;
- pod_limits.py: what the prepared shares of each GPU give each pod (pure, over records);
- share.py, imex.py: a share's and an IMEX channel's part of a prepared device's record;
- files.py, gpu_locks.py: atomic writes, the node lock, per-GPU locks.

Imports no other package of the plugin: everything else builds on it.
"""
