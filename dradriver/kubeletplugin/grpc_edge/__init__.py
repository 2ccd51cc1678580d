"""The gRPC edge: what the kubelet calls on the plugin's two Unix sockets, served by
grpcio's asyncio server.

- server.py: the sockets and their servers (options, start, stop with GOAWAY, a socket
  recreated when someone removes it);
- servicers.py: registration, DRA v1 and v1beta1, and health v1 and v1alpha1, each a thin
  translation between protobuf messages and the driver;
- late.py: the driver as the sockets see it before startup has built it;
- health_feed.py: what the health streams send, fed from the plugin's health monitor;
- loop.py: the thread that runs the asyncio loop the servers live on.

Imported first at startup (the registration socket comes before anything heavy), so
nothing here imports prepare, NVML or the Kubernetes client; the driver arrives through
late.Driver, a protocol.
"""
