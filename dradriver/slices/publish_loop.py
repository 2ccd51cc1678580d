"""Keeps publishing: PublishLoop runs the publisher again every period and on demand,
and retries with backoff while the API server is away.

Its own file because it is the plugin's long-running thread (when to publish, and what
to do after a failure), while publish.py is the writer one round calls: what the API
server should hold and the fewest writes to get it there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dradriver.logs import get_logger
from dradriver.slices.build import SliceContent
from dradriver.slices.publish import SlicePublisher, SyncStats

# The publisher's name: a round's lines ("publishing slices failed") stay where log
# filters on slices.publish look for them.
log = get_logger("slices.publish")


@dataclass
class PublishLoop:
    """Publishes what `desired()` returns, again every `period` seconds and whenever
    `trigger()` is called (SIGHUP, re-registration), retrying with backoff while the API
    server is unavailable. Nothing is published before `desired()` first succeeds."""

    publisher: SlicePublisher
    desired: Callable[[], Sequence[SliceContent]]
    period: float = 300.0
    backoff_max: float = 60.0
    on_error: Callable[[Exception], None] | None = None
    published: threading.Event = field(default_factory=threading.Event)
    # Set once the first round has ended, published or failed.
    attempted: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)
    last_stats: SyncStats | None = None
    last_error: str = ""
    rounds: int = 0
    # What the startup's discovery found: published as is by the first round (no second
    # discovery on the way to the first slice).
    first: Sequence[SliceContent] | None = None
    # What was last published, and whether the next round may publish it again without
    # a discovery (republish()).
    last: Sequence[SliceContent] | None = None
    _same: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def trigger(self) -> None:
        """A round with a new discovery."""
        with self._lock:
            self._same = False
            self._wake.set()

    def republish(self) -> None:
        """A round that publishes the last content again, without a new discovery (the
        devices did not change; the API server's slices may have), unless a trigger()
        waiting asks for more."""
        with self._lock:
            if not self._wake.is_set():
                self._same = True
            self._wake.set()

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                with self._lock:
                    same, self._same = self._same, False
                if self.first is not None:
                    content, self.first = self.first, None
                elif same and self.last is not None:
                    content = self.last
                else:
                    content = self.desired()
                self.last = content
                self.last_stats = self.publisher.sync(content)
                self.rounds += 1
                log.debug(
                    "devices rediscovered",
                    node=self.publisher.node,
                    round=self.rounds,
                    writes=self.last_stats.writes,
                )
                self.published.set()
                self.last_error = ""
                failures = 0
                wait = self.period
            except Exception as exc:  # a failed discovery lands here too: keep serving
                failures += 1
                wait = min(self.backoff_max, 0.5 * 2 ** min(failures, 8))
                self.last_error = str(exc)
                log.error(
                    "publishing slices failed; will retry",
                    node=self.publisher.node,
                    error=str(exc),
                    retry_in=f"{wait:.1f}s",
                )
                if self.on_error:
                    self.on_error(exc)
            self.attempted.set()
            deadline = time.monotonic() + wait
            while not stop.is_set() and time.monotonic() < deadline:
                if self._wake.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                    self._wake.clear()
                    break
