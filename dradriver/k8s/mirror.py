"""A collection kept in memory as the API server holds it: listed once, then watched from
the last resourceVersion seen (events' and bookmarks'), listed again only when that
version is gone. The controller reads its mirrors instead of listing on every pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dradriver.k8s.client import Kube, KubeError, Obj
from dradriver.k8s.follow import follow
from dradriver.logs import get_logger

log = get_logger("k8s.mirror")


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def _newer(a: Obj, b: Obj) -> bool:
    """Whether `a` is a later version of the object than `b`. resourceVersions are opaque
    to clients, but every API server stores them as etcd's revision, a number that only
    grows; where either is not one, neither is taken as newer."""
    ra = str((a.get("metadata") or {}).get("resourceVersion", ""))
    rb = str((b.get("metadata") or {}).get("resourceVersion", ""))
    return ra.isdigit() and rb.isdigit() and int(ra) > int(rb)


class Mirror:
    """Thread-safe. `on_change` is called (from the watching thread) after every change
    and after each list."""

    def __init__(self, kube: Kube, path: str, on_change: Callable[[], None], **query: str) -> None:
        self.kube, self.path, self.on_change, self.query = kube, path, on_change, query
        self._items: dict[str, Obj] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def wrote(self, obj: Obj) -> None:
        """An object this process has just written: read back as written, until its
        watch event (or a later one) replaces it. Never over a newer one: the watch may
        have brought a later change (someone deleting it) before the writer got here, and
        no further event would put that back."""
        with self._lock:
            key = key_of(obj)
            held = self._items.get(key)
            if held is None or not _newer(held, obj):
                self._items[key] = obj

    def forgot(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def run(self, stop: threading.Event) -> None:
        follow(
            self.kube,
            self.path,
            self.query,
            relist=self._relist,
            on_event=self._event,
            stop=stop,
            watch_timeout=60,
            backoff=lambda n: min(30.0, 0.5 * 2.0 ** min(n, 8)),
            failed=self._failed,
        )

    def _failed(self, exc: KubeError, rv: str | None, wait: float | None) -> None:
        if wait is not None:  # None: a version compacted away, which is routine
            log.warning(
                "watch failed; " + ("listing again" if rv is None else "resuming"),
                path=self.path,
                error=exc.message or str(exc),
                retry_in=f"{wait:.1f}s",
            )

    def _relist(self) -> str | None:
        listing = self.kube.list(self.path, **self.query)
        with self._lock:
            self._items = {key_of(o): o for o in listing.get("items") or []}
        self.synced.set()
        self.on_change()
        rv = (listing.get("metadata") or {}).get("resourceVersion")
        return str(rv) if rv else None

    def _event(self, ev: Obj) -> None:
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "BOOKMARK" or not (obj.get("metadata") or {}).get("name"):
            return
        with self._lock:
            if kind == "DELETED":
                self._items.pop(key_of(obj), None)
            else:
                self._items[key_of(obj)] = obj
        self.on_change()
