"""The kubelet's DRA health service (KEP-4680, gate ResourceHealthStatus):
v1alpha1.DRAResourceHealth/NodeWatchResources on the DRA socket.

What the v1.34 kubelet does with it (pkg/kubelet/cm/dra): it opens the stream on every
connection to the plugin when its gate is on, retrying every 5 s; each message replaces
its view of the devices it names; a device not heard of for 30 s (healthinfo.go's
healthTimeout) becomes Unknown. So each stream gets the full state at once, again on
every change, and again every `resend` seconds (well inside the 30 s). The registration
names the service in supported_versions, as the Go kubeletplugin helper does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
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
        self._cond = threading.Condition()
        self._version = 0
        self._stopped = False
        self._pool = ""
        self._source: Callable[[], Mapping[str, str]] | None = None
        self.streams = 0  # open streams, for tests and /metrics

    def attach(self, pool: str, source: Callable[[], Mapping[str, str]]) -> None:
        with self._cond:
            self._pool, self._source = pool, source
            self._version += 1
            self._cond.notify_all()

    def changed(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Ends every stream (the kubelet reconnects to whichever instance serves)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def message(self) -> Any:
        msgs = kapi.health_v1alpha1
        with self._cond:
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

    def stream(self, active: Callable[[], bool]) -> Iterator[Any]:
        with self._cond:
            self.streams += 1
        try:
            with self._cond:
                while self._source is None and not self._stopped and active():
                    self._cond.wait(1.0)
            while not self._stopped and active():
                with self._cond:
                    seen = self._version
                yield self.message()
                with self._cond:
                    self._cond.wait_for(
                        lambda seen=seen: self._version != seen or self._stopped,  # type: ignore[misc]
                        timeout=self.resend,
                    )
        finally:
            with self._cond:
                self.streams -= 1


class HealthServicer:
    """v1alpha1.DRAResourceHealth, served from `feed`."""

    def __init__(self, feed: HealthFeed) -> None:
        self.feed = feed

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        # A cancelled stream (the kubelet went away) wakes its waiting generator.
        context.add_callback(self.feed.changed)
        yield from self.feed.stream(context.is_active)
