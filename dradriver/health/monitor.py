"""The NVML edge of device health: an event thread blocked in nvmlEventSetWait on XID
and double-bit ECC events, and a probe thread that looks at every GPU each period (the
handle still answers, the GPU is on the bus, no row remapping or page retirement is
pending). Both turn what NVML said into observations for one HealthBook (model.py) and
report what changed. NVML must stay initialised while they run (the plugin keeps it so).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from dradriver.health.model import (
    LOST,
    EccEvent,
    GpuHealth,
    HealthBook,
    Instance,
    Observation,
    Probe,
    Transition,
    XidEvent,
)
from dradriver.logs import get_logger

log = get_logger("health.monitor")

# nvmlEventData_t's gpuInstanceId when the event is not tied to a GPU instance.
NO_INSTANCE = 0xFFFFFFFF
WAIT_MS = 500
ROW_REMAP_PENDING = "row-remap-pending"
ROW_REMAP_FAILED = "row-remap-failed"
RETIRED_PAGES_PENDING = "retired-pages-pending"


def _key(handle: Any) -> int | None:
    """A device handle as a number (the event's `device` is the same pointer)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _not_reported(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    return (
        nvml.NVMLError_NotSupported,
        nvml.NVMLError_FunctionNotFound,
        nvml.NVMLError_InvalidArgument,
    )


def probe_gpu(nvml: ModuleType, uuid: str) -> Probe:
    """One look at GPU `uuid` through NVML."""
    try:
        h = nvml.nvmlDeviceGetHandleByUUID(uuid)
        if str(nvml.nvmlDeviceGetUUID(h)) != uuid:
            return Probe(uuid, unknown="NVML answered for another GPU")
    except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_NotFound):
        return Probe(uuid, problem=LOST)
    except nvml.NVMLError as err:
        return Probe(uuid, unknown=f"{type(err).__name__}: {err}")
    try:
        _, _, pending, failed = nvml.nvmlDeviceGetRemappedRows(h)
        if failed:
            return Probe(uuid, problem=ROW_REMAP_FAILED)
        if pending:
            return Probe(uuid, problem=ROW_REMAP_PENDING)
    except _not_reported(nvml):
        pass  # GPUs before the A100 retire pages instead
    except nvml.NVMLError_GpuIsLost:
        return Probe(uuid, problem=LOST)
    except nvml.NVMLError as err:
        return Probe(uuid, unknown=f"{type(err).__name__}: {err}")
    try:
        if nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == nvml.NVML_FEATURE_ENABLED:
            return Probe(uuid, problem=RETIRED_PAGES_PENDING)
    except _not_reported(nvml):
        pass
    except nvml.NVMLError_GpuIsLost:
        return Probe(uuid, problem=LOST)
    except nvml.NVMLError as err:
        return Probe(uuid, unknown=f"{type(err).__name__}: {err}")
    return Probe(uuid)


class HealthMonitor:
    """Owns the HealthBook; `gpus()` names the GPUs to watch as (index, UUID);
    `on_change` hears every transition (from the monitor's threads, outside its lock)."""

    def __init__(
        self,
        nvml: ModuleType,
        book: HealthBook,
        gpus: Callable[[], Sequence[tuple[int, str]]],
        *,
        on_change: Callable[[Transition], None],
        probe_period: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml, self.book, self.gpus, self.on_change = nvml, book, gpus, on_change
        self.probe_period, self.clock = probe_period, clock
        self._lock = threading.Lock()
        self.events_watched = threading.Event()  # set once the event set is registered
        self._recovered: set[str] = set()
        self.probe_rounds = 0

    def snapshot(self) -> dict[str, GpuHealth]:
        with self._lock:
            return dict(self.book.gpus)

    def observe(self, obs: Observation) -> Transition | None:
        with self._lock:
            t = self.book.observe(obs, int(self.clock()))
            if t is not None and t.recovered:
                self._recovered.add(t.uuid)
        if t is not None:
            self.on_change(t)
        return t

    # -- probes -----------------------------------------------------------------------
    def probe_once(self) -> None:
        for _, uuid in self.gpus():
            self.observe(probe_gpu(self.nvml, uuid))
        self.probe_rounds += 1

    def run_probes(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.probe_once()
            except Exception as exc:  # never let a probe bug end health checking
                log.error("health probe failed", error=repr(exc))
            stop.wait(self.probe_period)

    # -- events -----------------------------------------------------------------------
    def run_events(self, stop: threading.Event) -> None:
        nvml = self.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.error("NVML events unavailable; health relies on probes", error=str(err))
            return
        handles: dict[int, str] = {}  # handle key -> GPU UUID
        registered: set[str] = set()
        last_register = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now - last_register > self.probe_period:
                    # GPUs back on the bus (or new) are registered again on the period.
                    self._register(event_set, handles, registered)
                    last_register = now
                    self.events_watched.set()
                try:
                    data = nvml.nvmlEventSetWait(event_set, WAIT_MS)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as err:
                    log.warning("nvmlEventSetWait failed", error=str(err))
                    stop.wait(1.0)
                    continue
                obs = self._translate(data, handles)
                if obs is not None:
                    self.observe(obs)
                with self._lock:
                    # A GPU back from a reset gets a new registration (and handle).
                    registered -= self._recovered
                    self._recovered.clear()
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def _register(self, event_set: Any, handles: dict[int, str], registered: set[str]) -> None:
        nvml = self.nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        for _, uuid in self.gpus():
            if uuid in registered:
                continue
            try:
                h = nvml.nvmlDeviceGetHandleByUUID(uuid)
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(h))
                nvml.nvmlDeviceRegisterEvents(h, wanted & supported, event_set)
            except nvml.NVMLError as err:
                log.debug("GPU events not registered (yet)", gpu=uuid, error=str(err))
                continue
            key = _key(h)
            if key is not None:
                handles[key] = uuid
            registered.add(uuid)

    def _translate(self, data: Any, handles: dict[int, str]) -> Observation | None:
        nvml = self.nvml
        uuid = handles.get(_key(data.device) or -1)
        if uuid is None:
            try:
                uuid = str(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                log.warning("NVML event from a GPU we cannot name; ignored", type=data.eventType)
                return None
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            instance = None
            gi = int(data.gpuInstanceId)
            if gi != NO_INSTANCE:
                instance = self._instance(data.device, gi)
            log.info(
                "XID event",
                gpu=uuid,
                xid=xid,
                gpu_instance=gi if gi != NO_INSTANCE else None,
                skipped=xid in self.book.policy.skip_xids,
            )
            return XidEvent(uuid, xid, instance)
        if data.eventType & nvml.nvmlEventTypeDoubleBitEccError:
            log.info("double-bit ECC error event", gpu=uuid)
            return EccEvent(uuid)
        return None

    def _instance(self, device: Any, gi_id: int) -> Instance | None:
        """The GPU instance an XID names, by profile and placement; None (the whole GPU
        is then taken as faulty) when NVML cannot say."""
        nvml = self.nvml
        try:
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(device, gi_id))
        except nvml.NVMLError:
            return None
        return Instance(int(info.profileId), int(info.placement.start))
