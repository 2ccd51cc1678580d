"""The operator endpoints: /healthz, /readyz (server.py; its checks in api_probe.py and
readiness.py) and /metrics (metrics.py, with the gauges refreshed each second).
Imported after discovery: nothing on the way to the first slice needs them."""
