"""Kube.watch: events as they come, ERROR events raised, the connection kept or dropped
as the stream ended; and when a failed watch may resume from its resourceVersion."""

from __future__ import annotations

import pytest

from dradriver.k8s import Kube, KubeError
from dradriver.k8s.mirror import resource_version, resumable
from tests.support.k8s.fakeapi import FakeAPI


def test_watch_streams_events_as_they_come(api: FakeAPI, kube: Kube) -> None:
    api.watch_events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"s{i}", "resourceVersion": str(i)}}}
        for i in range(4)
    ] + [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]
    stream = kube.watch("/watch", resource_version="3", timeout_seconds=5, fieldSelector="a=b")
    first = next(stream)
    # The server holds the rest back until we have the first: it came as a stream.
    assert first["object"]["metadata"]["name"] == "s0"
    api.watch_gate.set()
    rest = list(stream)
    assert [e["type"] for e in rest] == ["ADDED"] * 3 + ["BOOKMARK"]
    assert resource_version(rest[-1]) == "9"
    (seen,) = [s for s in api.seen if s.path.startswith("/watch")]
    assert seen.path == (
        "/watch?fieldSelector=a%3Db&watch=true&timeoutSeconds=5"
        "&allowWatchBookmarks=true&resourceVersion=3"
    )
    assert seen.headers["Authorization"] == "Bearer secret"
    # The stream ended cleanly: its connection serves the next request.
    kube.get("/version")
    assert len(api.connections()) == 1


def test_watch_error_events_raise(api: FakeAPI, kube: Kube) -> None:
    api.watch_gate.set()
    api.watch_events = [
        {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
    ]
    with pytest.raises(KubeError) as exc:
        list(kube.watch("/watch"))
    assert (exc.value.status, exc.value.reason, exc.value.message) == (410, "Expired", "too old")
    assert not resumable(exc.value)


def test_a_watch_left_early_closes_its_connection(api: FakeAPI, kube: Kube) -> None:
    api.watch_events = [{"type": "ADDED", "object": {}}] * 3
    stream = kube.watch("/watch")
    next(stream)
    stream.close()
    api.watch_gate.set()
    kube.get("/version")
    assert len(api.connections()) == 2  # the half-read stream was not reused


def test_a_watch_that_is_refused_raises_its_status(kube: Kube) -> None:
    with pytest.raises(KubeError) as exc:
        next(kube.watch("/forbidden"))
    assert exc.value.status == 403


@pytest.mark.parametrize(
    ("status", "message", "resume"),
    [
        (0, "the stream broke", True),
        (429, "slow down", True),
        (500, "etcd leader changed", True),
        (410, "too old resource version: 5 (9)", False),
        (403, "forbidden", False),
        (504, "Too large resource version: 12, current: 9", False),
    ],
)
def test_which_failures_a_watch_resumes_from(status: int, message: str, resume: bool) -> None:
    assert resumable(KubeError(status, "", message)) is resume


def test_the_resource_version_of_an_event() -> None:
    assert resource_version({"type": "MODIFIED", "object": {"metadata": {"resourceVersion": 7}}})
    assert resource_version({"type": "ADDED", "object": {"metadata": {}}}) is None
    assert resource_version({"type": "ADDED"}) is None
