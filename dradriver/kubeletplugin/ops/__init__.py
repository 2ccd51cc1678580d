"""The operator endpoints: /healthz, /readyz (server.py, api_probe.py) and /metrics
(metrics.py). Imported after discovery: nothing on the way to the first slice needs
them."""
