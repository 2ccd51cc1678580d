"""The node component, `dradriver kubelet-plugin`: the kubelet's sockets, prepare and
unprepare, the node's state on disk and the hardware steps. Its packages, from the edge
inwards:

- grpc_edge/: the kubelet's registration, DRA (v1, v1beta1) and health sockets on
  grpcio's asyncio server; imports nothing heavy, and reaches the driver only through a
  protocol (grpc_edge.late.Driver);
- prepare/: a claim from the API to its CDI devices and back: plan (pure), execute,
  reconcile at startup, claim status, CDI specs;
- state/: what the node keeps on disk: the checkpoint, the MIG and sharing ledgers, the
  journal of steps, the node and GPU locks; imports no other package here;
- daemons/: the daemons prepared claims depend on (MPS, IMEX), each a pod of its own on
  the node, so that it outlives the plugin's container;
- hardware/: the MIG and sharing (time-slicing, MPS) steps the executor runs, over NVML
  (dradriver.nvml), the ledgers in state/ and the daemons' pods;
- imex_binding/: before a pod is bound, a ComputeDomain's IMEX daemon started while the
  scheduler waits on the channel device's binding conditions, and what the node says
  of it in the claim's status; over prepare's plan and hardware/imex.py;
- device_view/: the device view publishing and prepare share, and the node's GPU health;
- endpoints/: the HTTP endpoints /healthz, /readyz and /metrics.

main.py wires them (startup.py first binds the sockets); options.py holds the flags and
the typed options they are parsed into once;
uninstall.py, at a graceful stop, asks the API whether the driver was uninstalled and then
tidies the state directory (state/tidy.py plans what goes).
"""
