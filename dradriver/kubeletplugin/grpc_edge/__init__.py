"""The gRPC edge: what the kubelet calls on the plugin's two Unix sockets, served by
grpcio's asyncio server (server.py the sockets, servicers.py the services and the preparer
before startup has built it, health_feed.py the health streams; server.py also runs the
loop). Imported first at startup, so nothing here imports prepare, NVML or the Kubernetes
client (of state/, only the records, for ClaimRef); the preparer arrives through
servicers.Preparer. See docs/design.md, "The gRPC servers"."""
