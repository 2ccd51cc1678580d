"""Before a pod is bound: a ComputeDomain's IMEX daemon started while the scheduler holds
the pod's binding on the channel device's binding conditions (KEP-5007). plan.py decides
(pure), binder.py watches and acts, probe.py asks whether the API server keeps them.
May import prepare/, hardware/ and state/; nothing imports it but main.py.
See docs/design.md, "IMEX channels and daemons"."""
