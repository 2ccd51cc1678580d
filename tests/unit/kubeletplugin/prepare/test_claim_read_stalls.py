"""No prepare outlives the kubelet's patience: a hung API server fails a claim read well
inside the kubelet's 45 s, an unprepare that arrives while a prepare of the same claim
waits wins, and /readyz answers at once while the API server hangs."""

from __future__ import annotations

import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kclient

from dradriver.k8s import Kube
from dradriver.kubeletplugin.endpoints.api_probe import ApiProbe
from dradriver.kubeletplugin.prepare import claim_read
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from tests.support.gpu_names import fake_names, real
from tests.support.node import NODE, allocated_claim, fake_preparer


@pytest.fixture
def hung_api() -> Iterator[Kube]:
    """An "API server" that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    cfg = kclient.Configuration()
    cfg.host = f"http://127.0.0.1:{srv.getsockname()[1]}"
    kube = Kube(kclient.ApiClient(cfg))
    yield kube
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()
    kube.close()


def test_an_unprepare_during_a_stalled_prepare_wins(tmp_path: Path) -> None:
    claim = allocated_claim("c", real("gpu-0-mig-1g10gb-0", fake_names("1xH100-80GB", NODE)))
    ref = ClaimRef("team", claim["metadata"]["uid"], "c")
    reading, release = threading.Event(), threading.Event()

    def slow_read(r: ClaimRef) -> dict[str, Any]:
        reading.set()
        release.wait(10)  # the API server hangs
        return claim

    driver, nvml = fake_preparer(tmp_path, "1xH100-80GB", slow_read)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(driver.prepare([ref])))
    t.start()
    assert reading.wait(5)
    assert driver.unprepare([ref]) == {ref.uid: ""}  # the kubelet gave up on it
    release.set()
    t.join(10)
    assert "was unprepared while this prepare waited" in out[ref.uid].error
    assert driver.store.load().claims == {}
    assert not list((tmp_path / "cdi").glob("*.json"))
    assert nvml.backend.machine.gpus[0].gpu_instances == {}
    # A prepare that starts after the unprepare is a new request: it goes through.
    driver.read_claim = lambda r: claim
    assert driver.prepare([ref])[ref.uid].error == ""
    assert driver.unprepare([ref]) == {ref.uid: ""}


def test_a_hung_api_server_fails_the_claim_read_in_time(
    tmp_path: Path, hung_api: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claim_read, "CLAIM_READ_TIMEOUT", 1.0)
    driver, _ = fake_preparer(tmp_path, "1xH100-80GB", lambda r: {})
    driver.read_claim, driver.kube = None, hung_api
    ref = ClaimRef("team", str(uuidlib.uuid4()), "c")
    start = time.monotonic()
    err = driver.prepare([ref])[ref.uid].error
    assert time.monotonic() - start < 3  # one read, no hidden retries
    assert "reading claim team/c failed" in err


def test_readyz_answers_at_once_while_the_api_server_hangs(hung_api: Kube) -> None:
    probe = ApiProbe(hung_api, ttl=0.1, timeout=0.5)
    # The first answer waits for the first probe (so it is the API server's answer, never
    # "not checked yet"), at most the probe's timeout; every later one comes at once.
    start = time.monotonic()
    ok, why = probe.check()
    assert not ok and time.monotonic() - start < 0.5 + 0.2, why
    for _ in range(8):
        start = time.monotonic()
        ok, why = probe.check()
        assert time.monotonic() - start < 0.2
        assert not ok
        time.sleep(0.1)
    why = probe.check()[1]
    assert "not answering" in why or "timed out" in why, why
