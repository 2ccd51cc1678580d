"""Which Kubernetes line the API server runs (its /version), for the slices' layout.

The control plane is upgraded under running plugins (it goes first, and a kubelet may be
three minors behind), so the answer is read again after `ttl` seconds, and at once after
`forget` (the API server refused a slice, or a watch on it broke, as it does when the
server restarts) or a failed ask; until the first answer the newest line is assumed: its
layout is what 1.35 and later accept, and a 1.34 server refuses only the dynamic-MIG
slices of it, which the next round then lays out again for 1.34.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dradriver.k8s.client import Kube, KubeError
from dradriver.k8s.lines import NEWEST, Line, LineError, line
from dradriver.logs import get_logger

log = get_logger("k8s.version")

# How long the first answer is waited for, before the newest line is assumed.
FIRST_WAIT = 10.0


class ServerLine:
    def __init__(
        self, kube: Kube, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kube, self.ttl, self._clock = kube, ttl, clock
        self._line: Line | None = None
        self._at = float("-inf")
        self._first = threading.Event()
        self._started = False
        self._failing = False  # the last ask failed (said once, until one succeeds)
        self._lock = threading.Lock()
        self.version = ""  # the API server's gitVersion, as it said it

    def prefetch(self) -> None:
        """Asks on a thread of its own (at startup, beside NVML's discovery)."""
        self._started = True
        threading.Thread(target=self._ask, name="server-line", daemon=True).start()

    def _ask(self) -> None:
        try:
            version = str(self.kube.get("/version", timeout=10).get("gitVersion", ""))
            found = line(version)
        except (KubeError, LineError) as exc:
            # Asked again at the next line(): a server that does not answer now (one
            # being upgraded, say) is the one whose line matters next.
            with self._lock:
                said, self._failing = self._failing, True
            if not said:
                log.warning(
                    "cannot tell the API server's Kubernetes line; slices are laid out for "
                    f"{(self._line or NEWEST).name} until it answers",
                    error=getattr(exc, "message", str(exc)),
                )
        else:
            with self._lock:
                if self._line is not None and self._line.minor != found.minor:
                    log.info(
                        "the API server's Kubernetes line changed; slices follow",
                        was=self._line.name,
                        now=found.name,
                        version=version,
                    )
                self._line, self._at, self.version = found, self._clock(), version
                self._failing = False
        finally:
            self._first.set()

    def line(self) -> Line:
        """The server's line: the prefetched answer (waited for at most FIRST_WAIT), then
        a fresh one once the last is older than ttl."""
        if not self._started:
            self.prefetch()
        if not self._first.wait(FIRST_WAIT):
            return NEWEST
        # Unlocked reads: _ask replaces each of these whole, and under its lock.
        if self._clock() - self._at > self.ttl:
            self._ask()
        return self._line or NEWEST

    def forget(self) -> None:
        """The next line() asks again (a slice was refused: the server may have changed)."""
        self._at = float("-inf")
