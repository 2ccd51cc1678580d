"""The plugin's own gRPC server over HTTP/2 (server.py), gRPC's framing (framing.py), and
the listening sockets (listener.py), which need neither: they are bound first, so the
kubelet finds them before the rest is imported."""
