"""What the controller's fleet metrics cost (issue Q19 item 1), at N simulated nodes of 8
NVLinked H100s (two 3-GPU claims on each, a few Pending claims), in four node groups:

- CPU seconds of one update (the controller recomputes the report from its mirrors:
  build_world, fleet, the Pending claims' explain reasons), the median of 3, against its
  floor measured in the same run: build_world alone, what reading the same objects into
  typed records costs;
- memory: what the mirrors' objects and one update's results hold (tracemalloc, in a
  separate pass: it slows what it measures);
- the series one scrape returns, and its bytes: bounded by products, groups, profiles and
  reasons, not by nodes, so the same at 500 and at 5,000.

    .venv/bin/python benchmarks/fleet_metrics.py [--nodes 500,5000] [--pending 3]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.fleet_report import lists  # noqa: E402
from dradriver.controller.fleet import FleetMetrics  # noqa: E402
from dradriver.diagnose.world import build_world  # noqa: E402
from dradriver.k8s import Kube  # noqa: E402
from tests.support.explain import CLASSES  # noqa: E402

GROUPS = 4


def filled(n: int, pending: int) -> FleetMetrics:
    s, c, nodes, pods = lists(n, pending)
    fm = FleetMetrics(cast(Kube, None), period=30, group_label="pool")
    for i, nd in enumerate(nodes):
        nd["metadata"]["labels"]["pool"] = f"group-{i % GROUPS}"
        fm.nodes.wrote(nd)
    for i, obj in enumerate(s):
        # fleet_report's copies share their names and their devices; here each is its
        # own, as the API server's objects are.
        own = copy.deepcopy(obj)
        own["metadata"]["name"] = f"{own['spec']['nodeName']}-{i}"
        fm.slices.wrote(own)
    for obj in c:
        fm.claims.wrote(obj)
    for obj in CLASSES:
        fm.classes.wrote(obj)
    for obj in pods:
        fm.pods.wrote(obj)
    return fm


def cpu(f: Any, rounds: int = 3) -> float:
    took = []
    for _ in range(rounds):
        t0 = time.thread_time()
        f()
        took.append(time.thread_time() - t0)
    return statistics.median(took)


def measure(n: int, pending: int) -> None:
    fm = filled(n, pending)
    floor = cpu(
        lambda: build_world(fm.slices.items(), CLASSES, fm.claims.items(), nodes=fm.nodes.items())
    )
    clock = [0.0]

    def update() -> None:
        clock[0] += 30
        fm.update(clock[0])

    took = cpu(update)
    registry = CollectorRegistry()
    registry.register(fm)
    text = generate_latest(registry)
    series = sum(len(f.samples) for f in text_string_to_metric_families(text.decode()))
    del fm
    gc.collect()
    tracemalloc.start()
    fm = filled(n, pending)
    held = tracemalloc.get_traced_memory()[0]
    fm.update(1.0)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(
        f"{n:>6} {8 * n:>6} {floor:>9.2f}s {took:>8.2f}s {took / floor:>5.1f}x "
        f"{held / 2**20:>9.0f}MiB {(after - held) / 2**20:>9.1f}MiB {series:>7} {len(text):>8}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", default="500,5000")
    ap.add_argument("--pending", type=int, default=3)
    a = ap.parse_args(argv)
    print(
        f"{'nodes':>6} {'GPUs':>6} {'floor':>10} {'update':>9} {'ratio':>6} "
        f"{'mirrored':>12} {'update+':>12} {'series':>7} {'bytes':>8}"
    )
    for n in (int(x) for x in a.nodes.split(",")):
        measure(n, a.pending)
    return 0


if __name__ == "__main__":
    sys.exit(main())
