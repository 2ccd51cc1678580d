"""The Grafana dashboard tells the truth (Q19 item 3): a real Prometheus (Debian's, from
`make prometheus`) scrapes the controller's fleet metrics and a kubelet plugin's /metrics
while the cluster holds the issue's twelve-node fleet (96 H100s, 72 allocated, a 4-GPU pod
Pending, 24 stranded) beside a hollow node whose L4 runs a pod; then every query of every
panel of deploy/dashboards/fleet.json is evaluated through Prometheus's HTTP API and must
return what that scenario implies. A panel without an expectation here fails the test.

The twelve nodes are Node objects with their slices (the driver's own build of eight fake
H100s each) and claims allocated as the scheduler writes them, by the admin: no kubelet
runs there, as none is needed for what the fleet counts.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.k8s import Kube, KubeError, path_for
from tests.support.explain import slices

from .helpers import (
    REPO,
    RES,
    Cluster,
    DradriverProcess,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    debian_package,
    ensure_device_classes,
    free_port,
    wait_for,
)

DASHBOARD = REPO / "deploy" / "dashboards" / "fleet.json"
D = "gpu.dradriver.io"
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
GROUP = "pool"  # the Node label the controller groups by here


@pytest.fixture(scope="module")
def prometheus_bin() -> Path:
    return debian_package("prometheus") / "usr" / "bin" / "prometheus"


def twelve_nodes(kube: Kube, ns: str) -> Iterator[None]:
    """The fleet, made by the admin; everything it made is deleted after."""
    made: list[str] = []
    try:
        for i in range(12):
            n = f"fleet-{ns[-6:]}-{i:02d}"
            kube.create(
                path_for("v1", "nodes"), {"metadata": {"name": n, "labels": {GROUP: "h100"}}}
            )
            made.append(path_for("v1", "nodes", name=n))
            devices: list[str] = []
            for s in slices(n, "8xH100-80GB"):
                kube.create(path_for(RES, "resourceslices"), s)
                made.append(path_for(RES, "resourceslices", name=s["metadata"]["name"]))
                devices += [d["name"] for d in s["spec"]["devices"]]
            for j, part in enumerate((devices[0:3], devices[3:6])):
                allocate(kube, ns, f"{n}-{j}", n, part)
        kube.create(path_for(RES, "resourceclaims", ns), claim("wide", 4))
        # Pending: no node has four free, and none is where it may go anyway.
        kube.create(
            path_for("v1", "pods", ns),
            {
                "metadata": {"name": "wide"},
                "spec": {
                    "nodeSelector": {"dradriver.io/e2e": "never"},
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": "wide"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpus"}]},
                        }
                    ],
                },
            },
        )
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(KubeError):
                kube.delete(path, missing_ok=True)


def claim(name: str, count: int) -> dict[str, Any]:
    exactly = {"deviceClassName": D, "count": count}
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }


def allocate(kube: Kube, ns: str, name: str, node: str, devices: list[str]) -> None:
    """A claim allocated `devices` of `node`'s pool and reserved for a pod, as the
    scheduler writes it."""
    path = path_for(RES, "resourceclaims", ns)
    c = kube.create(path, claim(name, len(devices)))
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpus", "driver": D, "pool": node, "device": d} for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"uid-{name}"}],
    }
    kube.replace(f"{path}/{name}/status", c)


class FleetController(DradriverProcess):
    """`dradriver controller` with the fleet's metrics only (no webhook configuration to
    patch, no ComputeDomains), recomputing every second."""

    def __init__(self, kubeconfig: str, tmp: Path) -> None:
        self.kubeconfig, self.healthz = kubeconfig, free_port()
        self.log_path, self.proc = tmp / "controller.log", None

    def start(self) -> None:
        self._spawn(
            [
                "controller",
                f"--kubeconfig={self.kubeconfig}",
                "--webhook-address=127.0.0.1",
                "--webhook-port=0",
                f"--healthz-port={self.healthz}",
                "--compute-domains=off",
                "--webhook-config-name=dradriver-e2e-none",
                "--fleet-metrics=on",
                "--fleet-period=1",
                f"--fleet-group-label={GROUP}",
            ]
        )


class Prometheus:
    def __init__(self, binary: Path, root: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: each series' labels (sorted pairs, without __name__) and value."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", (expr, body)
        return {
            tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(
                s["value"][1]
            )
            for s in body["data"]["result"]
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def by(label: str, got: dict[tuple[tuple[str, str], ...], float]) -> dict[str, float]:
    return {dict(k).get(label, ""): v for k, v in got.items()}


def near(want: float, rel: float = 0.25) -> Callable[[float], bool]:
    return lambda v: not math.isnan(v) and abs(v - want) <= rel * want


# What each panel's queries (in order) must return in the scenario: a dict of the series by
# the label that names them (an exact number, or a check), {} for no series at all.
Want = dict[str, float | Callable[[float], bool]]
PANELS: dict[str, list[tuple[str, Want]]] = {
    "Busy vs stranded GPUs": [("product", {H100: 72, L4: 1}), ("product", {H100: 24})],
    "Busy": [("", {"": 100 * 73 / 97})],
    "Stranded GPUs": [("", {"": 24})],
    # The counter grows by the GPUs stranded each second: its rate is the GPUs stranded.
    "Stranded GPU-hours an hour": [("", {"": near(24)})],
    "Stranded GPUs by reason": [("reason", {"too-few-free": 24})],
    "Free shapes: nodes where a pod of this shape still fits": [
        (
            "shape",
            {
                "1 GPU": 12,
                "2 GPUs": 12,
                "4 GPUs": 0,
                "8 GPUs": 0,
                "2 NVLinked": 12,
                "4 NVLinked": 0,
                "8 NVLinked": 0,
            },
        )
    ],
    "MIG partitions free by profile": [("profile", {})],
    "GPUs by state": [
        ("state", {"allocated": 73, "free": 24, "carved": 0, "shared": 0, "tainted": 0})
    ],
    "Health-tainted GPUs": [("product", {H100: 0, L4: 0}), ("reason", {})],
    "Pending claims by reason": [("reason", {"allocation": 1})],
    "Prepare latency (p50, p99)": [
        ("", {"": lambda v: 0 < v < 10}),
        ("", {"": lambda v: 0 < v < 10}),
    ],
    "Prepare and unprepare errors": [("operation", {}), ("result", {"ok": lambda v: v > 0})],
}


def evaluate(prom: Prometheus, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    # Grafana's variables as they are with "All" selected; $__rate_interval is Grafana's
    # max(4 x scrape interval, step + scrape interval): 5 s over a 1 s scrape here (a
    # wider window would reach back before the scenario's series began, and rate() reads
    # a counter that began inside its window as that much slower).
    expr = expr.replace("$node_group", ".*").replace("$__rate_interval", "5s")
    return prom.query(expr)


def test_every_panel_of_the_dashboard_reads_the_twelve_node_fleet(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    hollow_node: Callable[..., HollowNode],
    prometheus_bin: Path,
    tmp_path: Path,
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}
    assert set(panels) == set(PANELS), "every panel needs what the scenario implies here"
    ensure_device_classes(kube)
    kubelet = hollow_node()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:1xL4")
    plugin.start()
    controller = FleetController(cluster.kubeconfig, tmp_path)
    prom = None
    fleet = twelve_nodes(kube, namespace)
    try:
        next(fleet)
        wait_for(plugin.ready, "the plugin", 30)
        controller.start()
        prom = Prometheus(
            prometheus_bin, tmp_path, {"controller": controller.healthz, "plugin": plugin.port}
        )
        # The L4's pod: its prepare is what the plugin's panels show.
        node = NodeUnderTest(kube, namespace, kubelet, plugin)
        node.claim_and_pod("l4", "true", device_class=D, request="gpus")
        node.running("l4")

        def scraped() -> bool:
            assert controller.alive(), controller.log()[-3000:]
            assert prom is not None and prom.proc.poll() is None, prom.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                up = by("job", prom.query("up"))
                fleet_ok = prom.query('sum(dradriver_fleet_gpus{state="allocated"})')
                prepared = prom.query("sum(dradriver_prepare_duration_seconds_count)")
                return (
                    up == {"controller": 1, "plugin": 1}
                    and list(fleet_ok.values()) == [73]
                    and list(prepared.values()) == [1]
                )
            return False

        wait_for(scraped, "Prometheus scraping the fleet and the plugin", 60, interval=1)
        # A second prepare, now that Prometheus has seen the first: the rates of the
        # plugin's counters (their series begin at the first prepare) see it grow.
        node.delete("l4")
        node.claim_and_pod("l4-again", "true", device_class=D, request="gpus")
        node.running("l4-again")
        wait_for(
            lambda: (
                list(prom.query("sum(dradriver_prepare_duration_seconds_count)").values()) == [2]
            ),
            "the second prepare scraped",
            30,
            interval=1,
        )
        # The fleet's counters show the second pod as well (they lag a scrape or two).
        wait_for(
            lambda: (
                list(prom.query('sum(dradriver_fleet_gpus{state="allocated"})').values()) == [73]
                and not prom.query('dradriver_fleet_stranded_gpus{product!="' + H100 + '"}')
            ),
            "the fleet with the second pod",
            30,
            interval=1,
        )
        # The rates' window (5 s) holds a scrape a second of the counters (a loaded machine
        # may miss a few: rate() reads a gap at the window's edge as a slower counter).
        h100 = f'product="{H100}"'
        wait_for(
            lambda: (
                all(
                    v >= 5
                    for v in prom.query(
                        f"count_over_time(dradriver_fleet_stranded_gpu_hours_total{{{h100}}}[5s])"
                    ).values()
                )
                and bool(prom.query(f"dradriver_fleet_stranded_gpu_hours_total{{{h100}}}"))
            ),
            "five scrapes of the stranded GPU-hours in the last 5 s",
            30,
            interval=0.5,
        )
        wrong = []
        for title, wants in PANELS.items():
            for expr, (label, want) in zip(panels[title], wants, strict=True):
                got = by(label, evaluate(prom, expr))
                ok = set(got) == set(want) and all(
                    w(got[k]) if callable(w) else math.isclose(got[k], w, rel_tol=1e-6)
                    for k, w in want.items()
                )
                if not ok:
                    wrong.append(f"{title}: {expr}\n  got {got}")
        if wrong:  # what Prometheus holds of the fleet's counter, for the reader
            url = f"http://127.0.0.1:{prom.port}/api/v1/query?" + urllib.parse.urlencode(
                {"query": "dradriver_fleet_stranded_gpu_hours_total[8s]"}
            )
            with urllib.request.urlopen(url, timeout=10) as r:
                wrong.append(r.read().decode()[:3000])
        assert not wrong, "\n".join(wrong)
    finally:
        with contextlib.suppress(StopIteration):
            next(fleet)
        if prom is not None:
            prom.stop()
        controller.stop()
        plugin.stop()
