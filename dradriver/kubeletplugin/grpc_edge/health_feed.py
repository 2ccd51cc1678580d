"""What the kubelet's DRA health streams send (KEP-4680, gate ResourceHealthStatus):
NodeWatchResources of v1 and v1alpha1 DRAResourceHealth, both on the DRA socket, both fed
from one HealthFeed: the full state at once, on every change and every `resend` seconds.
What the kubelets do with it, and why so: docs/design.md, "Health".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import ModuleType
from typing import Any

RESEND_SECONDS = 10.0
# A report's health_check_timeout_seconds, in resends: 30 s at 10 s, the 1.34 kubelet's
# fixed timeout, so every line turns a silent plugin's devices Unknown alike.
TRUST_RESENDS = 3
# The kubelet's cap on a message (v1.ResourceHealthMessageMaxLength, bytes). It cuts at a
# byte count, which may split a UTF-8 character; cut here first, on a character.
MESSAGE_MAX_BYTES = 1024

# Each device's report: its health value and why ("" when there is no reason to give).
Source = Callable[[], Mapping[str, tuple[str, str]]]


def clip(message: str) -> str:
    """`message` within MESSAGE_MAX_BYTES, the way the kubelet cuts it ("..." last)."""
    raw = message.encode()
    if len(raw) <= MESSAGE_MAX_BYTES:
        return message
    return raw[: MESSAGE_MAX_BYTES - 3].decode(errors="ignore") + "..."


class HealthFeed:
    """Device health as the streams send it. The plugin attaches its source once the
    devices are known; until then a stream waits (the socket is up before that)."""

    def __init__(self, resend: float = RESEND_SECONDS) -> None:
        self.resend = resend
        self._lock = threading.Lock()
        self._stopped = False
        # The pool's name and its devices' reports, once attached; replaced whole, so read
        # without the lock (which guards the waiters).
        self._source: tuple[str, Source] | None = None
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def streams(self) -> int:
        """Open streams, for tests and /metrics."""
        with self._lock:
            return len(self._waiters)

    def attach(self, pool: str, source: Source) -> None:
        self._source = (pool, source)
        self.changed()

    def changed(self) -> None:
        """Every stream sends the state again. Safe from any thread."""
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing waits
                loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        """Ends every stream (the kubelet reconnects to whichever instance serves)."""
        self._stopped = True
        self.changed()

    def message(self, msgs: ModuleType) -> Any:
        """The full state as one NodeWatchResourcesResponse of `msgs`, the generated
        module of a health version (kapi.health_v1 or kapi.health_v1alpha1)."""
        pool, source = self._source or ("", lambda: {})
        now = int(time.time())
        # health_check_timeout_seconds: whole seconds, at least one (0 is the default).
        timeout = max(1, math.ceil(TRUST_RESENDS * self.resend))
        resp = msgs.NodeWatchResourcesResponse()
        for name, (health, why) in sorted(source().items()):
            resp.devices.add(
                device=msgs.DeviceIdentifier(pool_name=pool, device_name=name),
                # dradriver.health.model.Health's values (not imported: this module loads
                # with the sockets, before anything heavy), upper-cased, are the proto's.
                health=msgs.HealthStatus.Value(health.upper()),
                last_updated_time=now,
                health_check_timeout_seconds=timeout,
                message=clip(why),
            )
        return resp

    async def stream(self, msgs: ModuleType) -> AsyncIterator[Any]:
        """The messages of one stream (of `msgs`, as message() takes it), until stop();
        a cancelled call (the kubelet went away) ends it where it waits."""
        event = asyncio.Event()
        me = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(me)
        try:
            while not self._stopped:
                attached = self._source is not None
                if attached:
                    yield self.message(msgs)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), self.resend if attached else None)
                # Cleared before the state is read again: a change after this (while the
                # next message is sent, too) wakes the next wait at once.
                event.clear()
        finally:
            with self._lock:
                self._waiters.discard(me)
