"""How the Preparer takes a kubelet call: each claim on its own (one that fails, with a
DriverError or a bug no layer foresaw, fails alone, with its metric, its log line and an
error the kubelet shows in the pod's events), and the unprepares that come while
prepares run (UnpreparedMeanwhile)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from dradriver.errors import DriverError
from dradriver.kubeletplugin.claimref import ClaimRef
from dradriver.kubeletplugin.endpoints.metrics import Metrics
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.prepare")
T = TypeVar("T")


def internal_error(ref: ClaimRef, exc: Exception) -> DriverError:
    """An exception no layer turned into a DriverError, as this claim's error: the log
    has the traceback for a bug report."""
    if isinstance(exc, RecursionError):
        return DriverError(
            f"claim {ref}: the claim nests too deeply to be read; simplify its parameters",
            reason="too_deep",
        )
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + "..."
    return DriverError(
        f"claim {ref}: internal error ({type(exc).__name__}: {text}); this is a bug in "
        "dradriver, please report it with the plugin's log",
        reason="internal",
    )


def each_claim(
    op: str, refs: list[ClaimRef], one: Callable[[ClaimRef], T], *, metrics: Metrics
) -> dict[str, T | DriverError]:
    """`one(ref)` for each claim: its result, or its error."""
    seconds = metrics.prepare_seconds if op == "prepare" else metrics.unprepare_seconds
    out: dict[str, T | DriverError] = {}

    def failed(ref: ClaimRef, err: DriverError, start: float, *, trace: bool) -> None:
        out[ref.uid] = err
        seconds.labels("error").observe(time.monotonic() - start)
        metrics.errors.labels(op, err.reason).inc()
        log.error(
            f"{op} failed",
            exc=trace,  # the traceback, logged while its exception is being handled
            claim=str(ref),
            claim_uid=ref.uid,
            layer=err.layer,
            reason=err.reason,
            error=str(err),
        )

    for ref in refs:
        start = time.monotonic()
        try:
            out[ref.uid] = one(ref)
        except DriverError as exc:
            failed(ref, exc, start, trace=False)
        except Exception as exc:  # a bug or an input nobody foresaw: this claim only
            failed(ref, internal_error(ref, exc), start, trace=True)
        else:
            seconds.labels("ok").observe(time.monotonic() - start)
    return out


class UnpreparedMeanwhile:
    """Which claims were unprepared while a prepare was running (the kubelet may give up
    on a prepare stalled on the API server), so that the prepare does not prepare them
    after all; kept only for the prepares in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, float] = {}  # prepare token -> when it began (monotonic)
        self._at: dict[str, float] = {}  # claim UID -> last unprepare, oldest first
        self._tokens = itertools.count()

    def prepare_began(self) -> tuple[int, float]:
        """A prepare starts: its token (for prepare_ended) and its start time."""
        with self._lock:
            token, began = next(self._tokens), time.monotonic()
            self._running[token] = began
            return token, began

    def prepare_ended(self, token: int) -> None:
        with self._lock:
            self._running.pop(token, None)
            if not self._running:
                self._at.clear()

    def unprepared(self, uid: str) -> None:
        with self._lock:
            if not self._running:
                return  # every later prepare begins after this
            self._at.pop(uid, None)  # re-inserted last: the dict stays in time order
            self._at[uid] = time.monotonic()
            oldest = min(self._running.values())
            while self._at:
                first = next(iter(self._at))
                if self._at[first] >= oldest:
                    break
                del self._at[first]

    def since(self, uid: str, began: float) -> bool:
        """Whether `uid` was unprepared at or after `began`."""
        with self._lock:
            return self._at.get(uid, float("-inf")) >= began

    def __len__(self) -> int:
        with self._lock:
            return len(self._at)
