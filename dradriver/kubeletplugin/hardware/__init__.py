"""The hardware steps of prepare and unprepare, each undoable: mig.py (MIG carved on
demand, MIG mode), sharing.py (time-slicing and MPS), shares.py with pod_memory.py
(shares by memory and compute), imex.py (a ComputeDomain's IMEX daemon), driver_files.py
(the driver's files). Built on dradriver.nvml and the ledger in state/.
"""
