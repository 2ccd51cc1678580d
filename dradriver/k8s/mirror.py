"""Following a collection: listed once, then watched on from the last resourceVersion seen
each time a watch ends or breaks (an event's, or a BOOKMARK's, which the server sends so
that quiet watches keep a recent one): that misses nothing and costs the API server no
LIST. It is listed again only when that version is gone or the server refuses to resume
from it (`resumable`). `follow` is the loop, for any caller to keep what it needs; a
`Mirror` keeps the collection in memory, as the API server holds it, for the controller
to read instead of listing on every pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from dradriver.k8s.client import Kube, KubeError, Obj
from dradriver.logs import get_logger

log = get_logger("k8s.mirror")


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def _version(obj: Obj) -> str:
    """An object's resourceVersion, or a list's; "" where it has none."""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _newer(a: Obj, b: Obj) -> bool:
    """Whether `a` is a later version of the object than `b`. resourceVersions are opaque
    to clients, but every API server stores them as etcd's revision, a number that only
    grows; where either is not one, neither is taken as newer."""
    ra, rb = _version(a), _version(b)
    return ra.isdigit() and rb.isdigit() and int(ra) > int(rb)


def resource_version(event: Obj) -> str | None:
    """The resourceVersion of a watch event's object (BOOKMARKs carry one too)."""
    return _version(event.get("object") or {}) or None


def resumable(exc: KubeError) -> bool:
    """Whether a watch that failed with `exc` may start again from its last
    resourceVersion: yes after a broken stream, a timeout, a 429 or a server error; not
    once the version is gone (410, compacted away), nor when the server refused the
    request as made (any other 4xx, or a version it has not reached yet)."""
    if "too large resource version" in exc.message.lower():
        return False
    return exc.status in (0, 429) or exc.status >= 500


def follow(
    kube: Kube,
    path: str,
    query: Mapping[str, str],
    *,
    relist: Callable[[], str | None],
    on_event: Callable[[Obj], None],
    stop: threading.Event,
    failed: Callable[[KubeError, str | None, float | None], None],
    watch_timeout: int = 60,
    backoff: Callable[[int], float] = lambda n: min(30.0, 0.5 * 2.0 ** min(n, 8)),
) -> None:
    """Runs until `stop`. `relist` lists (keeping what it needs) and returns the
    resourceVersion to watch from; `on_event` keeps each event; `failed(exc, rv, wait)`
    hears of each failure, to log it: `wait` None for a version that expired (listed
    again at once), else the seconds before going on from `rv` (None: listing);
    `backoff(n)` is that wait after n failures in a row."""
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
        return _version(listing) or None

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
