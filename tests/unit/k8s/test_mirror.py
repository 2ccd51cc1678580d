"""A mirror keeps the newest version of each object: what this process wrote is read back
at once, but never over a later change the watch brought first (a ComputeDomain deleted
just as the controller wrote its status, and whose deletion it then never saw: e2e, CI
2026-12-06)."""

from __future__ import annotations

from typing import Any, cast

from dradriver.k8s import Kube
from dradriver.k8s.mirror import Mirror


def obj(rv: str, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ns", "resourceVersion": rv, **meta}}


def test_a_write_read_back_never_hides_a_later_event() -> None:
    m = Mirror(cast(Kube, None), "/apis/x/v1/things", lambda: None)
    m.wrote(obj("100"))
    assert m.get("ns/train") == obj("100")
    # The deletion's event (rv 101) comes before the writer's own read-back (rv 100).
    m._event({"type": "MODIFIED", "object": obj("101", deletionTimestamp="now")})
    m.wrote(obj("100"))
    held = m.get("ns/train")
    assert held is not None and held["metadata"]["deletionTimestamp"] == "now"
    m.wrote(obj("102"))  # a later write still wins
    assert m.get("ns/train") == obj("102")


def test_versions_that_are_not_numbers_are_taken_as_written() -> None:
    m = Mirror(cast(Kube, None), "/apis/x/v1/things", lambda: None)
    m._event({"type": "ADDED", "object": obj("b")})
    m.wrote(obj("a"))
    assert m.get("ns/train") == obj("a")
