"""Fleet metrics on the controller's /metrics (`--fleet-metrics on`): the report
`dradriver fleet` prints, kept over time. The controller mirrors what the report reads
(ResourceSlices, ResourceClaims, DeviceClasses, Nodes, Pending pods: a list once, then
watches) and recomputes it every `period` seconds with the same code
(diagnose/fleet.py, diagnose/fleet_metrics.py). A scrape reads the last result: it never
costs the API server a request, and every replica answers the same.

What `dradriver fleet` adds from other kinds (gangs placed in part: Jobs and PodGroups;
claims held by finished pods) is left to the command: those kinds are not watched here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dradriver.diagnose import fleet_metrics as fm
from dradriver.diagnose.fleet import fleet
from dradriver.diagnose.fleet_claims import pending_requests
from dradriver.diagnose.fleet_report import FleetReport
from dradriver.diagnose.world import World, build_world
from dradriver.k8s import Kube, path_for
from dradriver.k8s.mirror import Mirror
from dradriver.logs import get_logger

log = get_logger("controller.fleet")
RES = "resource.k8s.io/v1"
Obj = Mapping[str, Any]
# Cloud providers and the kubelet set it on every node: a group per instance type.
DEFAULT_GROUP_LABEL = "node.kubernetes.io/instance-type"


class FleetMetrics(Collector):
    def __init__(
        self,
        kube: Kube,
        *,
        period: float,
        group_label: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.period, self.group_label, self.clock = period, group_label, clock
        self._changed = threading.Event()
        wake = self._changed.set
        self.slices = Mirror(kube, path_for(RES, "resourceslices"), wake)
        self.claims = Mirror(kube, path_for(RES, "resourceclaims"), wake)
        self.classes = Mirror(kube, path_for(RES, "deviceclasses"), wake)
        self.nodes = Mirror(kube, path_for("v1", "nodes"), wake)
        self.pods = Mirror(kube, path_for("v1", "pods"), wake, fieldSelector="status.phase=Pending")
        self._mirrors = (self.slices, self.claims, self.classes, self.nodes, self.pods)
        self._lock = threading.Lock()
        self._samples: list[fm.Sample] = []
        self._pending: Mapping[str, int] = {}
        self._hours: dict[tuple[str, str], float] = {}
        self._last: tuple[float, Any, Mapping[str, str]] | None = None
        self._drawn: tuple[World, FleetReport, list[Obj]] | None = None
        self.update_seconds = 0.0
        self.updates = 0

    def start(self, stop: threading.Event, registry: CollectorRegistry) -> None:
        registry.register(self)
        for m in self._mirrors:
            threading.Thread(
                target=m.run, args=(stop,), name=f"fleet-{m.path}", daemon=True
            ).start()
        threading.Thread(target=self._loop, args=(stop,), name="fleet", daemon=True).start()

    def synced(self) -> bool:
        return all(m.synced.is_set() for m in self._mirrors)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.synced() and self._changed.is_set():
                self._changed.clear()
                try:
                    self.update(time.monotonic())
                except Exception:  # a bug of ours: the next round tries again
                    log.error("fleet metrics not updated", exc=True)
            stop.wait(self.period)

    def _hours_at(self, now: float) -> dict[tuple[str, str], float]:
        """The stranded GPU-hours counter at `now`: what it held at the last update, and
        the last report's stranded GPUs since (they are stranded still, until the next
        update says otherwise). Under the lock."""
        if self._last is None:
            return dict(self._hours)
        then, report, groups = self._last
        return fm.accrue(self._hours, report, groups, seconds=max(0.0, now - then))

    def update(self, now: float) -> None:
        """Recomputes the report from the mirrors; the stranded GPUs since the last update
        go into the GPU-hours counter (as the last report had them)."""
        started = time.thread_time()
        slices, claims, classes = self.slices.items(), self.claims.items(), self.classes.items()
        nodes, pods = self.nodes.items(), self.pods.items()
        groups = {
            str(n["metadata"]["name"]): str(
                ((n["metadata"].get("labels") or {}).get(self.group_label)) or fm.NO_GROUP
            )
            for n in nodes
        }
        by_name = {str(c["metadata"]["name"]): c for c in classes}
        requests, _ = pending_requests(pods, claims, by_name)
        world = build_world(slices, classes, claims, nodes=nodes)
        report = fleet(world, requests)
        samples = fm.gauges(report, groups)
        pending = fm.pending_reasons(pods, claims, world)
        with self._lock:
            self._hours = self._hours_at(now)
            self._last = (now, report, groups)
            self._samples, self._pending = samples, pending
            self._drawn = (world, report, list(claims))
            self.update_seconds = time.thread_time() - started
            self.updates += 1

    def page(self) -> tuple[bytes, str]:
        """The fleet's picture as of the last update (/fleet)."""
        from dradriver.diagnose.fleet_page import page
        from dradriver.diagnose.fleet_picture import picture

        with self._lock:
            drawn = self._drawn
        if drawn is None:
            return b"the fleet has not been read yet; reload in a few seconds\n", "text/plain"
        world, report, claims = drawn
        html = page(picture(world, report, claims), report)
        return html.encode(), "text/html; charset=utf-8"

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            # The counter as of this scrape, not of the last update: it grows smoothly.
            hours = self._hours_at(self.clock())
            samples, pending = list(self._samples), dict(self._pending)
            seconds, updates = self.update_seconds, self.updates
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for f in fm.FAMILIES:
            if f.kind == "counter":
                families[f.name] = CounterMetricFamily(f.name, f.help, labels=f.labels)
            else:
                families[f.name] = GaugeMetricFamily(f.name, f.help, labels=f.labels)
        for s in samples:
            families[s.family.name].add_metric(list(s.labels), s.value)
        for reason, n in sorted(pending.items()):
            families[fm.PENDING.name].add_metric([reason], n)
        for (product, group), h in sorted(hours.items()):
            families[fm.STRANDED_HOURS.name].add_metric([product, group], h)
        yield from families.values()
        yield GaugeMetricFamily(
            "dradriver_fleet_update_cpu_seconds",
            "CPU seconds the last recomputation of the fleet's metrics took",
            value=seconds,
        )
        yield CounterMetricFamily(
            "dradriver_fleet_updates", "Recomputations of the fleet's metrics", value=updates
        )
