"""Claim status is written once per prepared claim, after a short delay, and never for
a claim unprepared before that; nothing is written at unprepare."""

from __future__ import annotations

import time
from typing import Any

from dradriver.kubeletplugin.prepare.claim_status import StatusWriter
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.records import PreparedDevice
from tests.e2e.helpers import wait_for


class RecordingKube:
    def __init__(self) -> None:
        self.applied: list[tuple[str, dict[str, Any]]] = []

    def apply(self, path: str, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        self.applied.append((path, body))
        return body


def device(name: str) -> PreparedDevice:
    return PreparedDevice(
        request_names=["gpu"], pool="n1", device=name, cdi_device_ids=[f"x/claim={name}"]
    )


def writer(coalesce: float) -> tuple[StatusWriter, RecordingKube]:
    kube = RecordingKube()
    return StatusWriter(kube, "gpu.dradriver.io", coalesce=coalesce), kube  # type: ignore[arg-type]


def test_a_prepared_claim_is_written_once_after_the_delay() -> None:
    w, kube = writer(0.2)
    ref = ClaimRef("ns", "uid-1", "c")
    w.prepared(ref, [device("gpu-0")])
    w.prepared(ref, [device("gpu-0")])  # a repeat coalesces
    assert kube.applied == []
    wait_for(lambda: kube.applied, "the write", 5)
    time.sleep(0.3)
    (path, body) = kube.applied[0]
    assert len(kube.applied) == 1 and path.endswith("/namespaces/ns/resourceclaims/c/status"), path
    assert [d["device"] for d in body["status"]["devices"]] == ["gpu-0"]
    w.unprepared(ref)
    time.sleep(0.3)
    assert len(kube.applied) == 1  # nothing at unprepare
    w.close()


def test_a_claim_unprepared_before_its_write_costs_nothing() -> None:
    w, kube = writer(0.3)
    refs = [ClaimRef("ns", f"uid-{i}", f"c{i}") for i in range(50)]
    for r in refs:
        w.prepared(r, [device("gpu-0")])
        w.unprepared(r)
    time.sleep(0.6)
    assert kube.applied == []
    w.close()
