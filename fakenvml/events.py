"""NVML event sets: what nvmlEventSetWait hands out, queued per set as the driver does.

An event reaches the sets that had registered its type for its GPU when it happened;
events before a registration are lost, as on real hardware.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from fakenvml.returns import INVALID_ARGUMENT, NvmlReturn

# nvmlEventData_t's gpuInstanceId / computeInstanceId when the event is not tied to one.
NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True)
class Event:
    gpu: int
    event_type: int
    data: int
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass
class _EventSet:
    registrations: dict[int, int] = field(default_factory=dict)  # GPU index -> type mask
    queue: deque[Event] = field(default_factory=deque)


class EventHub:
    def __init__(self, lock: threading.RLock) -> None:
        self._changed = threading.Condition(lock)
        self._sets: dict[int, _EventSet] = {}
        self._next_id = 1

    def create(self) -> int:
        with self._changed:
            set_id = self._next_id
            self._next_id += 1
            self._sets[set_id] = _EventSet()
            return set_id

    def _set(self, set_id: int) -> _EventSet:
        s = self._sets.get(set_id)
        if s is None:
            raise NvmlReturn(INVALID_ARGUMENT, f"event set {set_id} was freed")
        return s

    def register(self, set_id: int, gpu: int, mask: int) -> None:
        with self._changed:
            s = self._set(set_id)
            s.registrations[gpu] = s.registrations.get(gpu, 0) | mask

    def post(self, event: Event) -> None:
        with self._changed:
            for s in self._sets.values():
                if s.registrations.get(event.gpu, 0) & event.event_type:
                    s.queue.append(event)
            self._changed.notify_all()

    def wait(self, set_id: int, timeout_ms: int) -> Event | None:
        """The oldest queued event, waiting up to timeout_ms; None on timeout."""
        with self._changed:
            self._changed.wait_for(
                lambda: set_id not in self._sets or bool(self._sets[set_id].queue),
                timeout=timeout_ms / 1000,
            )
            s = self._set(set_id)
            return s.queue.popleft() if s.queue else None

    def free(self, set_id: int) -> None:
        with self._changed:
            self._set(set_id)
            del self._sets[set_id]
            self._changed.notify_all()
