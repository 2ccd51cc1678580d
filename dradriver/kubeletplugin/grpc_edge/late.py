"""The preparer as the DRA socket sees it: the sockets are up before discovery, the
checkpoint and the API client are, and a call that comes meanwhile waits for them
(within its deadline) instead of finding no socket."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dradriver.kubeletplugin.state.records import ClaimRef


class Result(Protocol):
    error: str

    @property
    def devices(self) -> Sequence[Any]: ...


class Preparer(Protocol):
    """What the DRA socket serves: prepare.Preparer."""

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]: ...

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]: ...


@dataclass
class _NotReady:
    error: str
    devices: list[Any] = field(default_factory=list)


class LatePreparer:
    """A Preparer whose real one is set once startup has built it."""

    def __init__(self, patience: float = 30.0) -> None:
        self.patience = patience
        self._preparer: Preparer | None = None
        self._ready = threading.Event()
        self.reason: Callable[[], str] = lambda: "starting"

    def set(self, preparer: Preparer) -> None:
        self._preparer = preparer
        self._ready.set()

    def _not_ready(self, ref: ClaimRef) -> str:
        return f"claim {ref}: the plugin is still starting ({self.reason()}); the kubelet retries"

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Result]:
        if self._ready.wait(self.patience) and self._preparer is not None:
            return self._preparer.prepare(refs)
        return {r.uid: _NotReady(self._not_ready(r)) for r in refs}

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]:
        if self._ready.wait(self.patience) and self._preparer is not None:
            return self._preparer.unprepare(refs)
        return {r.uid: self._not_ready(r) for r in refs}


class RegistrationHooks:
    """The kubelet's registration answers, kept until the plugin is wired to hear them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fn: Callable[[bool, str], None] | None = None
        self._last: tuple[bool, str] | None = None

    def notify(self, ok: bool, error: str) -> None:
        with self._lock:
            self._last = (ok, error)
            fn = self._fn
        if fn is not None:
            fn(ok, error)

    def attach(self, fn: Callable[[bool, str], None]) -> None:
        with self._lock:
            self._fn, last = fn, self._last
        if last is not None:
            fn(*last)
