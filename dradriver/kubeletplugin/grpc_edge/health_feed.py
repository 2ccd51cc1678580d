"""What the kubelet's DRA health streams send (KEP-4680, gate ResourceHealthStatus):
v1alpha1.DRAResourceHealth/NodeWatchResources on the DRA socket.

What the v1.34 kubelet does with it (pkg/kubelet/cm/dra): it opens the stream on every
connection to the plugin when its gate is on, retrying every 5 s; each message replaces
its view of the devices it names; a device not heard of for 30 s (healthinfo.go's
healthTimeout) becomes Unknown. So each stream gets the full state at once, again on
every change, and again every `resend` seconds (well inside the 30 s). The registration
names the service in supported_versions, as the Go kubeletplugin helper does.

The feed is told of changes from the health monitor's threads; the streams wait on the
gRPC loop, each on an asyncio.Event that a change sets through its loop, so an open
stream holds no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from dradriver.api import kubelet as kapi

RESEND_SECONDS = 10.0

# dradriver.health.model.Health's values (not imported: this module loads with the
# sockets, before anything heavy) -> the proto's HealthStatus names.
_STATUS = {"Healthy": "HEALTHY", "Unhealthy": "UNHEALTHY", "Unknown": "UNKNOWN"}


class HealthFeed:
    """Device health as the streams send it. The plugin attaches its source once the
    devices are known; until then a stream waits (the socket is up before that)."""

    def __init__(self, resend: float = RESEND_SECONDS) -> None:
        self.resend = resend
        self._lock = threading.Lock()
        self._version = 0
        self._stopped = False
        self._pool = ""
        self._source: Callable[[], Mapping[str, str]] | None = None
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def streams(self) -> int:
        """Open streams, for tests and /metrics."""
        with self._lock:
            return len(self._waiters)

    def attach(self, pool: str, source: Callable[[], Mapping[str, str]]) -> None:
        with self._lock:
            self._pool, self._source = pool, source
        self.changed()

    def changed(self) -> None:
        """Every stream sends the state again. Safe from any thread."""
        with self._lock:
            self._version += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing waits
                loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        """Ends every stream (the kubelet reconnects to whichever instance serves)."""
        with self._lock:
            self._stopped = True
        self.changed()

    def message(self) -> Any:
        msgs = kapi.health_v1alpha1
        with self._lock:
            pool, source = self._pool, self._source
        now = int(time.time())
        resp = msgs.NodeWatchResourcesResponse()
        for name, health in sorted((source() if source else {}).items()):
            resp.devices.add(
                device=msgs.DeviceIdentifier(pool_name=pool, device_name=name),
                health=msgs.HealthStatus.Value(_STATUS.get(str(health), "UNKNOWN")),
                last_updated_time=now,
            )
        return resp

    async def stream(self) -> AsyncIterator[Any]:
        """The messages of one stream, until stop(); a cancelled call (the kubelet went
        away) ends it where it waits."""
        event = asyncio.Event()
        me = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(me)
        try:
            while True:
                # Cleared before the state is read: a change after this wakes the wait.
                event.clear()
                with self._lock:
                    stopped, attached, seen = self._stopped, self._source is not None, self._version
                if stopped:
                    return
                if attached:
                    yield self.message()
                with self._lock:
                    if self._version != seen or self._stopped:
                        continue
                timeout = self.resend if attached else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._lock:
                self._waiters.discard(me)
