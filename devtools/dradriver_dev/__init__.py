"""Developer tools of a dradriver checkout (not part of the product): the local control
plane (cluster.py), hollow nodes running the real kubelet (hollow_node.py), `make demo`
(demo.py) and the `dradriver dev` subcommands that expose them (cli.py)."""
