"""Before a pod is bound: a ComputeDomain's IMEX daemon started while the scheduler holds
the pod's binding on the channel device's binding conditions (KEP-5007), so that the
pod reaches its node only once the daemon there is ready, and is placed again when it
cannot get ready. plan.py decides (pure), binder.py watches and acts, probe.py asks the
API server whether it keeps binding conditions at all.

May import prepare/ (a claim's devices and its channel record, read as prepare reads
them), hardware/ (the IMEX steps) and state/; nothing imports it but main.py.
"""
