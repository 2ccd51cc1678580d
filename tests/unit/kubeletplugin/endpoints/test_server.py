"""The operator endpoints: up before discovery, metrics once the first slice is out."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import cast

from dradriver.k8s import Kube, KubeError
from dradriver.kubeletplugin.endpoints.api_probe import SLICES, ApiProbe, describe, slices_query
from dradriver.kubeletplugin.endpoints.metrics import Metrics
from dradriver.kubeletplugin.endpoints.server import OpsServer


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


class FakeKube:
    """The API server as the probe sees it: answers, refuses, or hangs until released."""

    host = "https://10.0.0.1:6443"

    def __init__(self, error: KubeError | None = None, hang: bool = False) -> None:
        self.error = error
        self.calls: list[tuple[str, dict[str, object]]] = []
        self.release = threading.Event()
        if not hang:
            self.release.set()
        self.called = threading.Event()

    def get(self, path: str, timeout: float | None = None, **query: object) -> dict[str, object]:
        self.calls.append((path, query))
        self.called.set()
        self.release.wait(10)
        if self.error:
            raise self.error
        return {}


def probe(kube: FakeKube, timeout: float = 3.0) -> ApiProbe:
    return ApiProbe(
        cast(Kube, kube), SLICES, slices_query("node-a", "gpu.dradriver.io"), timeout=timeout
    )


def test_the_first_readyz_answer_is_the_probes_result() -> None:
    """Not "not checked yet": the first check waits for the first probe."""
    kube = FakeKube()
    assert probe(kube).check() == (True, kube.host)
    # It asks what the plugin needs (its node's slices): /version is open to anyone.
    assert kube.calls == [
        (
            SLICES,
            {"fieldSelector": "spec.nodeName=node-a,spec.driver=gpu.dradriver.io", "limit": "1"},
        )
    ]


def test_the_probe_runs_from_start_without_a_query() -> None:
    kube = FakeKube()
    probe(kube).start()
    assert kube.called.wait(5)


def test_a_hanging_api_server_is_named_after_the_timeout() -> None:
    kube = FakeKube(hang=True)
    p = probe(kube, timeout=0.2)
    t0 = time.monotonic()
    ok, detail = p.check()
    assert not ok and time.monotonic() - t0 < 2
    assert detail == f"the API server at {kube.host} is not answering for 0 s"
    kube.release.set()


def test_each_refusal_is_told_apart() -> None:
    cases = {
        KubeError(401, "Unauthorized", "Unauthorized"): "refused the plugin's credentials (401",
        KubeError(403, "Forbidden", "cannot list"): "forbids the plugin's identity",
        KubeError(0, "Unreachable", "connection refused"): "cannot reach the API server at",
        KubeError(0, "NoCredentials", "exec plugin failed"): "has no credentials",
    }
    for error, said in cases.items():
        ok, detail = probe(FakeKube(error)).check()
        assert not ok and said in detail and FakeKube.host in detail, detail
        assert detail == describe(FakeKube.host, error)
