"""Following a collection: list once, then watch on from the last resourceVersion seen (an
event's or a bookmark's) each time a watch ends or breaks; list again only when that
version is gone or the server refuses to resume from it (watching.py decides which).
What a caller keeps and says of it is its own: `relist` and `on_event` keep, `failed`
logs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dradriver.k8s.client import Kube, KubeError
from dradriver.k8s.watching import resource_version, resumable


def follow(
    kube: Kube,
    path: str,
    query: Mapping[str, str],
    *,
    relist: Callable[[], str | None],
    on_event: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    watch_timeout: int,
    backoff: Callable[[int], float],
    failed: Callable[[KubeError, str | None, float | None], None],
) -> None:
    """Runs until `stop`. `relist` lists and returns the resourceVersion to watch from;
    `failed(exc, rv, wait)` hears of each failure: `wait` None for a version that expired
    (listed again at once), else the seconds before going on from `rv` (None: listing)."""
    failures = 0
    rv: str | None = None  # where the next watch starts; None: list first
    while not stop.is_set():
        try:
            if rv is None:
                rv = relist()
            started, events = time.monotonic(), 0
            for ev in kube.watch(path, resource_version=rv, timeout_seconds=watch_timeout, **query):
                if stop.is_set():
                    return
                rv = resource_version(ev) or rv
                events, failures = events + 1, 0
                on_event(ev)
            failures = 0
            if not events and time.monotonic() - started < 1.0:
                stop.wait(1.0)  # a server ending every watch at once: no busy loop
        except KubeError as exc:
            failures += 1
            if rv is not None and not resumable(exc):
                rv = None
                if failures == 1:  # a version compacted away is routine
                    failed(exc, None, None)
                    continue
            wait = backoff(failures)
            failed(exc, rv, wait)
            stop.wait(wait)
