"""The ComputeDomain controller: for each domain, its placement (a fabric clique with
room for spec.numNodes nodes, and an IMEX channel number no other domain of that clique
holds), the ResourceClaimTemplate that pins the job's claims to both, the nodes that
joined and whether their IMEX daemons are ready, and the clean-up when it is deleted.

Pure (no I/O, plain values in and out): records.py (typed views of the API objects),
placement.py (cliques, channel numbers), template.py (the template's body), reconcile.py
(one domain: what to write). The edge: controller.py (mirrors of the API objects, the
loop that applies each plan) and leader.py (one writer among replicas, over a Lease).
Only dradriver.controller.main imports the edge; the pure modules import nothing of it.
"""
