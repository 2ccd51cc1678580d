"""The gRPC edge: what the kubelet calls on the plugin's two Unix sockets, served by
grpcio's asyncio server (server.py the sockets, servicers.py the services, health_feed.py
the health streams, late.py the driver before startup has built it, loop.py the loop).
Imported first at startup, so nothing here imports prepare, NVML or the Kubernetes client
(of state/, only the records, for ClaimRef);
the driver arrives through late.Driver. See docs/design.md, "The gRPC servers"."""
