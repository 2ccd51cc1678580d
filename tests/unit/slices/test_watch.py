"""SliceWatch against a scripted API: a watch that ends or breaks goes on from the last
resourceVersion it saw, and the slices are listed again only when that version is gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from dradriver.k8s import KubeError
from dradriver.slices.watch import SliceWatch


def slice_obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "spec": {"devices": [{}]}}


class ScriptedKube:
    """Answers list and watch calls from a script, and notes each call."""

    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script, self.stop = script, stop
        self.calls: list[tuple[str, str | None]] = []

    def list(self, path: str, **query: Any) -> dict[str, Any]:
        self.calls.append(("list", None))
        kind, listing = self.script.pop(0)
        assert kind == "list", f"listed when the script said {kind}"
        return dict(listing)

    def watch(self, path: str, *, resource_version: str | None, **query: Any) -> Iterator[Any]:
        assert query["fieldSelector"] == "spec.nodeName=n1,spec.driver=gpu.dradriver.io"
        self.calls.append(("watch", resource_version))
        kind, events = self.script.pop(0)
        assert kind == "watch", f"watched when the script said {kind}"
        if not self.script:
            self.stop.set()
        for ev in events:
            if isinstance(ev, BaseException):
                raise ev
            yield ev


def test_a_watch_that_ends_or_breaks_resumes_and_only_a_gone_version_relists() -> None:
    stop = threading.Event()
    script: list[Any] = [
        ("list", {"metadata": {"resourceVersion": "10"}, "items": [slice_obj("s1", "5")]}),
        # Someone else changes s1, a bookmark, then the watch's timeoutSeconds ends it.
        (
            "watch",
            [
                {"type": "MODIFIED", "object": slice_obj("s1", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ],
        ),
        # Resumed from the bookmark; breaks after one event.
        (
            "watch",
            [
                {"type": "ADDED", "object": slice_obj("s2", "16")},
                KubeError(0, "Unreachable", "the stream broke"),
            ],
        ),
        ("watch", [KubeError(410, "Expired", "too old resource version: 16 (20)")]),
        (
            "list",
            {
                "metadata": {"resourceVersion": "30"},
                "items": [slice_obj("s1", "11"), slice_obj("s2", "16")],
            },
        ),
        ("watch", []),
    ]
    kube = ScriptedKube(script, stop)
    changes: list[str] = []
    watch = SliceWatch(
        kube,  # type: ignore[arg-type]
        "gpu.dradriver.io",
        "n1",
        changes.append,
        backoff_max=0.01,
    )
    t = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert kube.calls == [
        ("list", None),
        ("watch", "10"),
        ("watch", "15"),  # the timed-out watch resumed from its bookmark, no LIST
        ("watch", "16"),  # the broken one from its last event
        ("list", None),  # 410: the version is gone
        ("watch", "30"),
    ]
    assert script == []
    # The second listing held nothing the watch had not told us: no repair for it.
    assert changes == ["relisted", "modified s1", "added s2"]
    assert sorted(s["metadata"]["name"] for s in watch.held()) == ["s1", "s2"]


def test_a_failed_list_is_retried_as_a_list() -> None:
    stop = threading.Event()
    failing: list[Any] = []

    class FailingOnce(ScriptedKube):
        def list(self, path: str, **query: Any) -> dict[str, Any]:
            if not failing:
                failing.append(1)
                self.calls.append(("list", None))
                raise KubeError(0, "Unreachable", "refused")
            return super().list(path, **query)

    script: list[Any] = [
        ("list", {"metadata": {"resourceVersion": "3"}, "items": []}),
        ("watch", []),
    ]
    kube = FailingOnce(script, stop)
    watch = SliceWatch(kube, "gpu.dradriver.io", "n1", lambda why: None, backoff_max=0.01)  # type: ignore[arg-type]
    t = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    t.start()
    t.join(10)
    assert kube.calls == [("list", None), ("list", None), ("watch", "3")]
    assert watch.synced.is_set()
