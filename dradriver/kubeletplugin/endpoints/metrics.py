"""Prometheus metrics of one plugin instance (its own registry, so tests can run many),
and the gauges refreshed from the node's state once a second."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

if TYPE_CHECKING:
    from dradriver.health.model import DeviceHealth
    from dradriver.inventory.node_devices import NodeDevice, Skipped
    from dradriver.slices.watch import SliceWatch

# Prepare is a few file writes and one API read: most calls land well under 100 ms.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 45.0)


class Metrics:
    """The plugin's metrics, and the gauges that follow the node's state (refresh())."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        per_claim = partial(Histogram, labelnames=["result"], buckets=BUCKETS, registry=r)
        gauge = partial(Gauge, registry=r)
        self.prepare_seconds = per_claim(
            "dradriver_prepare_duration_seconds", "NodePrepareResources time per claim"
        )
        self.unprepare_seconds = per_claim(
            "dradriver_unprepare_duration_seconds", "NodeUnprepareResources time per claim"
        )
        self.errors = Counter(
            "dradriver_errors_total",
            "Failed operations by reason",
            ["operation", "reason"],
            registry=r,
        )
        self.prepared_claims = gauge(
            "dradriver_prepared_claims", "Claims currently prepared on this node"
        )
        self.published_devices = gauge(
            "dradriver_published_devices", "Devices in this node's ResourceSlices"
        )
        self.gpus_left_out = gauge(
            "dradriver_gpus_left_out",
            "GPUs of this node not published (or published in part), by reason",
            ["reason"],
        )
        self.device_healthy = gauge(
            "dradriver_device_healthy",
            "1 while a published device is healthy, 0 while it is unhealthy (tainted) or "
            "its health is unknown; reason: the fault (xid-79, lost, ecc-dbe, ...)",
            ["device", "gpu", "reason"],
        )
        self.registered = gauge(
            "dradriver_registered", "1 while the kubelet has accepted the registration"
        )
        self._series: set[tuple[str, str, str]] = set()  # device_healthy's, as last set

    def refresh(
        self,
        *,
        watch: SliceWatch,
        skipped: list[Skipped],
        devices: Mapping[str, NodeDevice],
        health: Mapping[str, DeviceHealth],
    ) -> None:
        """The gauges that follow the node's state: devices the API server holds, GPUs
        left out, each device's health. A device gone, or a reason past, loses its series:
        never a scrape of a stale one."""
        from dradriver.health.model import Health

        if watch.synced.is_set():
            self.published_devices.set(watch.devices_held())
        self.gpus_left_out.clear()
        for reason, n in collections.Counter(s.reason for s in skipped).items():
            self.gpus_left_out.labels(reason).set(n)
        shown: set[tuple[str, str, str]] = set()
        for name, h in health.items():
            why = h.fault.reason if h.fault else ("unknown" if h.health is Health.UNKNOWN else "")
            labels = (name, devices[name].gpu.uuid, why)
            self.device_healthy.labels(*labels).set(1 if h.health is Health.HEALTHY else 0)
            shown.add(labels)
        for labels in self._series - shown:
            self.device_healthy.remove(*labels)
        self._series = shown
