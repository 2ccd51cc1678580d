"""The operator endpoints: up before discovery, metrics once the first slice is out."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from dradriver.kubeletplugin.ops.metrics import Metrics
from dradriver.kubeletplugin.ops.server import OpsServer


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_probes_answer_before_the_metrics_exist() -> None:
    ready = {"discovery": lambda: (False, "NVML layer: the kernel driver is not loaded")}
    ops = OpsServer("127.0.0.1", 0, None, live={"process": lambda: (True, "serving")}, ready=ready)
    ops.start()
    try:
        assert get(ops.port, "/healthz")[0] == 200
        code, body = get(ops.port, "/readyz")
        assert code == 503
        assert json.loads(body)["discovery"]["detail"].startswith("NVML layer")
        assert get(ops.port, "/metrics") == (503, "starting: no metrics yet\n")
        metrics = Metrics()
        metrics.registered.set(1)
        ops.metrics = metrics
        code, text = get(ops.port, "/metrics")
        assert code == 200 and "registered" in text
    finally:
        ops.stop()
