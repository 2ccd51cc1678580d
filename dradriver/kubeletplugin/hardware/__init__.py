"""The hardware steps of prepare and unprepare, each undoable:

- mig.py: carve a claim's MIG partition, destroy it after, switch MIG mode where the
  product allows it;
- sharing.py: time-slicing and MPS (its control daemon per configuration);
- shares.py: consumable-capacity shares under one MPS daemon per device, their limits
  in its namespaces;
- pod_memory.py (with pod_cgroup.py, where the kubelet keeps a pod's cgroup): a share's
  memory as its pods' cgroup GPU-memory limit;
- imex.py: a ComputeDomain's IMEX daemon (nvidia-imex), at prepare or before binding.

Built on dradriver.nvml (where NVML is touched) and the ledgers in state/.
"""
