"""The controller's fleet metrics as Prometheus scrapes them: the mirrors filled with the
issue's twelve-node fleet, one update, and /metrics's text parsed back by
prometheus_client's own parser; the stranded GPU-hours counter grows with time."""

from __future__ import annotations

from typing import cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dradriver.controller.fleet import FleetMetrics
from dradriver.k8s import Kube
from tests.support.explain import CLASSES
from tests.support.fleet import twelve


def scraped(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_twelve_node_fleet_scraped() -> None:
    clock = [0.0]
    fm = FleetMetrics(cast(Kube, None), period=30, group_label="pool", clock=lambda: clock[0])
    f = twelve()
    for n in f.nodes:
        fm.nodes.wrote({**n, "metadata": {**n["metadata"], "labels": {"pool": "h100"}}})
    for objects, mirror in ((f.slices, fm.slices), (f.claims, fm.claims), (CLASSES, fm.classes)):
        for o in objects:
            mirror.wrote(o)
    for pod in f.pods:
        fm.pods.wrote(pod)
    registry = CollectorRegistry()
    registry.register(fm)
    fm.update(now=1000.0)
    clock[0] = 1000.0 + 1800  # half an hour later, nothing changed: a scrape
    assert (
        next(
            v
            for k, v in scraped(registry).items()
            if k[0] == "dradriver_fleet_stranded_gpu_hours_total"
        )
        == 12.0
    )
    fm.update(now=1000.0 + 3600)  # an hour after the first update
    clock[0] = 1000.0 + 3600
    got = scraped(registry)
    product = next(dict(k[1])["product"] for k in got if k[0] == "dradriver_fleet_gpus")

    def gpus(state: str) -> float:
        labels = (("node_group", "h100"), ("product", product), ("state", state))
        return got[("dradriver_fleet_gpus", labels)]

    assert (gpus("allocated"), gpus("free"), gpus("tainted")) == (72, 24, 0)
    stranded = (("node_group", "h100"), ("product", product), ("reason", "too-few-free"))
    assert got[("dradriver_fleet_stranded_gpus", stranded)] == 24
    hours = (("node_group", "h100"), ("product", product))
    assert got[("dradriver_fleet_stranded_gpu_hours_total", hours)] == 24.0
    assert got[("dradriver_fleet_pending_claims", (("reason", "allocation"),))] == 1
    assert got[("dradriver_fleet_nodes", (("node_group", "h100"),))] == 12
    assert got[("dradriver_fleet_updates_total", ())] == 2
    assert got[("dradriver_fleet_update_cpu_seconds", ())] > 0
