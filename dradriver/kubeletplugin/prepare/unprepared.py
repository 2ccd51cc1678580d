"""Which claims were unprepared while a prepare was running (the kubelet may give up on a
prepare stalled on the API server), so that the prepare does not prepare them after all;
kept only for the prepares in flight. See docs/design.md, "Prepare: read, plan, apply,
record".
"""

from __future__ import annotations

import itertools
import threading
import time


class UnpreparedMeanwhile:
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
