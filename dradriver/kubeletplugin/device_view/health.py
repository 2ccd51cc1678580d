"""Device health in the running plugin: the monitor's threads, the state kept on disk,
and what each change does (a slice write with the taints, the kubelet's health stream,
the metric, a log line and a node Event). The decisions live in dradriver.health."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver.health.model import (
    ECC_DBE,
    LOST,
    DeviceHealth,
    Fault,
    Health,
    HealthBook,
    Policy,
    Transition,
    XidEvent,
    device_health,
    unhealthy,
)
from dradriver.health.monitor import (
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILED,
    ROW_REMAP_PENDING,
    HealthMonitor,
)
from dradriver.health.store import FILE_NAME, HealthStore
from dradriver.inventory.model import Gpu, Inventory
from dradriver.inventory.node_devices import NodeDevice, gpu_device_name
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.logs import get_logger
from dradriver.slices.build import SliceContent
from dradriver.slices.taints import TaintEffect, rfc3339, taint_key, with_taints

log = get_logger("kubeletplugin.health")
EVENT_SOURCE = "dradriver-kubelet-plugin"

# What the XIDs that most often take a GPU out mean, in the words of NVIDIA's XID
# catalogue (docs.nvidia.com/deploy/xid-errors), for people reading a pod's status;
# any other XID goes by its number.
XID_MEANINGS = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_FAULTS = {
    LOST: "NVML cannot reach the GPU",
    ECC_DBE: "double-bit (uncorrectable) ECC error",
    ROW_REMAP_PENDING: "a memory row remapping waits for a GPU reset",
    ROW_REMAP_FAILED: "a memory row remapping failed",
    RETIRED_PAGES_PENDING: "a memory page retirement waits for a GPU reset",
}


def fault_message(fault: Fault) -> str:
    """Why a device is unhealthy, led by the taint's value so the two read alike."""
    if fault.xid is not None:
        meaning = XID_MEANINGS.get(fault.xid)
        what = f"NVIDIA XID {fault.xid}" + (f": {meaning}" if meaning else "")
    else:
        what = _FAULTS.get(fault.reason, "")
    head = f"{fault.reason} ({what})" if what else fault.reason
    return f"{head}, since {rfc3339(fault.since)}"


def health_message(state: DeviceHealth, unknown: str) -> str:
    """The kubelet's health message for a device: the fault, why its GPU's health is
    unknown (`unknown`: what the last probe could not tell), or nothing when healthy."""
    if state.fault is not None:
        return fault_message(state.fault)
    if state.health is Health.UNKNOWN:
        return f"the last probe could not tell: {unknown}" if unknown else ""
    return ""


@dataclass(frozen=True)
class HealthOptions:
    policy: Policy
    effect: TaintEffect
    probe_period: float


class NodeEvents:
    """Events on the Node object, posted in the background: a slow API server never
    holds up health handling."""

    def __init__(self, kube: Kube | None, node: str) -> None:
        self.kube, self.node = kube, node

    def emit(self, kind: str, reason: str, message: str) -> None:
        if self.kube is None:
            return
        threading.Thread(
            target=self._post, args=(kind, reason, message), name="node-event", daemon=True
        ).start()

    def _post(self, kind: str, reason: str, message: str) -> None:
        assert self.kube is not None
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body: dict[str, Any] = {
            "metadata": {"generateName": f"{self.node}.", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": EVENT_SOURCE, "host": self.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": EVENT_SOURCE,
            "reportingInstance": self.node,
        }
        try:
            node = self.kube.get(path_for("v1", "nodes", name=self.node))
            body["involvedObject"]["uid"] = node["metadata"]["uid"]
            self.kube.create(path_for("v1", "events", "default"), body)
        except KubeError as exc:
            log.warning("cannot post the node Event", reason=reason, error=exc.message)


class NodeHealth:
    def __init__(
        self,
        nvml: ModuleType,
        *,
        driver: str,
        state_dir: Path,
        options: HealthOptions,
        events: NodeEvents,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.driver, self.options, self.events = driver, options, events
        self.store = HealthStore(state_dir / FILE_NAME)
        saved = self.store.load()
        self.book = HealthBook(options.policy, dict(saved.gpus))
        self._lock = threading.Lock()
        self._known: dict[str, Gpu] = dict(saved.last_known)  # UUID -> last description
        # The GPUs the monitor watches, as (index, UUID): replaced whole, never changed in
        # place, so the monitor reads it without the lock.
        self._watched: list[tuple[int, str]] = [(g.index, u) for u, g in self._known.items()]
        self._devices: Callable[[], Iterable[NodeDevice]] = list
        self.listeners: list[Callable[[], None]] = []
        self.monitor = HealthMonitor(
            nvml,
            self.book,
            lambda: self._watched,
            on_change=self._changed,
            probe_period=options.probe_period,
            clock=clock,
        )
        for uuid, g in self.book.gpus.items():
            if g.faulty:
                log.warning(
                    "GPU still unhealthy from before the restart",
                    gpu=uuid,
                    reason=g.fault.reason if g.fault else g.instances[0][1].reason,
                )

    def start(self, stop: threading.Event, devices: Callable[[], Iterable[NodeDevice]]) -> None:
        self._devices = devices
        for name, target in (
            ("health-events", self.monitor.run_events),
            ("health-probe", self.monitor.run_probes),
        ):
            threading.Thread(target=target, args=(stop,), name=name, daemon=True).start()

    # -- what publishing asks ------------------------------------------------------------
    def inventory(self, inv: Inventory) -> Inventory:
        """The discovered inventory, plus the last description of each unhealthy GPU that
        NVML can no longer describe (off the bus): it stays published, tainted."""
        snapshot = self.monitor.snapshot()
        found = {g.uuid for g in inv.gpus}
        indices = {g.index for g in inv.gpus}
        with self._lock:
            kept = [
                g
                for u, h in snapshot.items()
                if h.faulty and u not in found and (g := self._known.get(u)) is not None
                if g.index not in indices
            ]
            # A GPU off the bus is still wired to its NVLink peers: their domain (named
            # after its members) stays what it was, or every peer's slice would change.
            domains = {g.nvlink_domain for g in kept if g.nvlink_domain}
            current = [
                replace(g, nvlink_domain=before.nvlink_domain)
                if (before := self._known.get(g.uuid)) and before.nvlink_domain in domains
                else g
                for g in inv.gpus
            ]
            self._known.update((g.uuid, g) for g in current)
            gpus = tuple(sorted((*current, *kept), key=lambda g: g.index))
            self._watched = [(g.index, g.uuid) for g in gpus]
        return replace(inv, gpus=gpus) if kept else inv

    def states(self, devices: Iterable[NodeDevice]) -> dict[str, DeviceHealth]:
        return device_health(HealthBook(self.book.policy, self.monitor.snapshot()), devices)

    def taint(
        self, slices: Sequence[SliceContent], devices: Iterable[NodeDevice]
    ) -> list[SliceContent]:
        return with_taints(
            slices, unhealthy(self.states(devices)), self.driver, effect=self.options.effect
        )

    def health_reports(self) -> dict[str, tuple[str, str]]:
        """For the kubelet's health streams: device name -> (health, why), why empty
        when healthy."""
        devices = {d.name: d for d in self._devices()}
        book = HealthBook(self.book.policy, self.monitor.snapshot())
        return {
            n: (str(h.health), health_message(h, book.get(devices[n].gpu.uuid).unknown))
            for n, h in device_health(book, devices.values()).items()
        }

    # -- what a change does ----------------------------------------------------------------
    def _changed(self, t: Transition) -> None:
        with self._lock:
            known = self._known.get(t.uuid)
            self.store.save(HealthBook(self.book.policy, self.monitor.snapshot()), self._known)
        index = known.index if known else None
        device = gpu_device_name(known) if known else None
        if t.after.health is Health.UNHEALTHY or (t.after.faulty and not t.before.faulty):
            fault = t.after.fault or (t.after.instances[-1][1] if t.after.instances else None)
            reason = fault.reason if fault else ""
            taint = f"{taint_key(self.driver)}={reason}:{self.options.effect}"
            states = self.states(d for d in self._devices() if d.gpu.uuid == t.uuid)
            tainted = sum(h.health is Health.UNHEALTHY for h in states.values())
            log.warning(
                "GPU unhealthy: its devices are tainted",
                device=device,
                gpu=t.uuid,
                index=index,
                reason=reason,
                xid=t.observation.xid if isinstance(t.observation, XidEvent) else None,
                taint=taint,
                tainted=tainted,
            )
            self.events.emit(
                "Warning",
                "GpuUnhealthy",
                f"GPU {index} ({t.uuid}) is unhealthy ({reason}): {tainted} devices "
                f"tainted {taint}",
            )
        elif t.recovered:
            log.info("GPU healthy again: taints removed", device=device, gpu=t.uuid, index=index)
            self.events.emit(
                "Normal", "GpuHealthy", f"GPU {index} ({t.uuid}) is healthy again; taints removed"
            )
        else:
            log.info(
                "GPU health changed", device=device, gpu=t.uuid, health=str(t.after.health),
                why=t.after.unknown or None,
            )  # fmt: skip
        for listener in self.listeners:
            listener()
