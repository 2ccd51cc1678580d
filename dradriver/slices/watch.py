"""Watches the node's own ResourceSlices, so what the API server holds is known and any
change made by someone else is repaired within seconds.

Someone else does change them: the kubelet deletes a node's slices when it starts, in
the background and retried until it sees its own Node, which with the real v1.34
kubelet often lands just after the plugin has re-registered and republished; an
operator may delete them by hand. Waiting for the next rediscovery would leave the node
publishing nothing for minutes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dradriver.k8s import Kube, KubeError
from dradriver.k8s.mirror import follow
from dradriver.logs import get_logger
from dradriver.slices.publish import SLICES

log = get_logger("slices.watch")


@dataclass
class SliceWatch:
    kube: Kube
    driver: str
    node: str
    on_change: Callable[[str], None]
    # Told when a watch broke (not merely expired): the API server may have restarted,
    # as it does when the control plane is upgraded to another line.
    on_broken: Callable[[], None] | None = None
    watch_timeout: int = 60
    backoff_max: float = 30.0
    # resourceVersions our own writes produced, and names of slices we deleted: their
    # events need no repair.
    _ours: deque[str] = field(default_factory=lambda: deque(maxlen=512))
    _deleted: deque[str] = field(default_factory=lambda: deque(maxlen=512))
    _held: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    synced: threading.Event = field(default_factory=threading.Event)

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    def wrote(self, obj: dict[str, Any]) -> None:
        """Tells the watch about a slice this process has just written."""
        rv = obj.get("metadata", {}).get("resourceVersion")
        if rv:
            with self._lock:
                self._ours.append(str(rv))

    def deleted(self, name: str) -> None:
        """Tells the watch about a slice this process has just deleted."""
        with self._lock:
            self._deleted.append(name)

    def held(self) -> list[dict[str, Any]]:
        """The node's slices of this driver as the API server last told us."""
        with self._lock:
            return list(self._held.values())

    def devices_held(self) -> int:
        return sum(len(s.get("spec", {}).get("devices") or []) for s in self.held())

    def run(self, stop: threading.Event) -> None:
        """Lists once, then watches on from the last resourceVersion seen (an event's or a
        bookmark's) each time a watch ends or breaks; lists again only when that version
        is gone (410) or the server refuses to resume from it."""
        follow(
            self.kube,
            SLICES,
            {"fieldSelector": self.selector},
            relist=self._relist,
            on_event=self._event,
            stop=stop,
            watch_timeout=self.watch_timeout,
            backoff=self._backoff,
            failed=self._failed,
        )

    def _failed(self, exc: KubeError, rv: str | None, wait: float | None) -> None:
        if wait is None:
            log.info("slice watch expired; re-listing", node=self.node)
            return
        if self.on_broken is not None:
            self.on_broken()
        log.warning(
            "slice watch failed; " + ("re-listing" if rv is None else "resuming"),
            node=self.node,
            error=exc.message or str(exc),
            resource_version=rv,
            retry_in=f"{wait:.1f}s",
        )

    def _backoff(self, failures: int) -> float:
        return min(self.backoff_max, 0.5 * 2.0 ** min(failures, 8))

    def _relist(self) -> str | None:
        """Lists the node's slices; returns the resourceVersion to watch from."""
        listing = self.kube.list(SLICES, fieldSelector=self.selector)
        now = {s["metadata"]["name"]: s for s in listing.get("items", [])}
        with self._lock:
            before = {n: o["metadata"]["resourceVersion"] for n, o in self._held.items()}
            self._held = now
        first = not self.synced.is_set()
        self.synced.set()
        # Whatever happened while we were not watching is looked at once.
        if first or before != {n: o["metadata"]["resourceVersion"] for n, o in now.items()}:
            self.on_change("relisted")
        rv = (listing.get("metadata") or {}).get("resourceVersion")
        return str(rv) if rv else None

    def _event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        obj = ev.get("object") or {}
        meta = obj.get("metadata") or {}
        name, rv = meta.get("name", ""), str(meta.get("resourceVersion", ""))
        if kind == "BOOKMARK" or not name:
            return
        with self._lock:
            if kind == "DELETED":
                self._held.pop(name, None)
                ours = name in self._deleted
                if ours:
                    self._deleted.remove(name)
            else:
                self._held[name] = obj
                ours = rv in self._ours
        if ours:
            return
        log.info(
            "slice changed by someone else; republishing",
            node=self.node,
            slice=name,
            event=str(kind).lower(),
        )
        self.on_change(f"{str(kind).lower()} {name}")
