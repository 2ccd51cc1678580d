"""The hardware steps of prepare and unprepare, each undoable:

- mig.py: carve a claim's MIG partition, destroy it after, switch MIG mode where the
  product allows it;
- sharing.py: time-slicing and MPS (its control daemon per configuration).

Built on dradriver.nvml (where NVML is touched) and the ledgers in state/.
"""
