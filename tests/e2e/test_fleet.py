"""`dradriver fleet` against the real API server and scheduler: on a hollow node whose
four A100s are NVLinked in pairs, with one GPU of each pair taken, the report says two
GPUs are free but no two in one NVLink domain; the scheduler agrees (a claim for two
NVLinked GPUs stays Pending while one for any two runs), and the report names the
Pending claim's free GPUs stranded by fragmentation, with their cost."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

import pytest

from dradriver.cli import main
from dradriver.k8s import Kube, path_for

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    PluginProc,
    ensure_device_classes,
    get_or_none,
    wait_for,
)

pytestmark = pytest.mark.e2e
D = "gpu.dradriver.io"


def gpu_claim(
    name: str, count: int, index: int | None = None, nvlinked: bool = False
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": D, "count": count}
    if index is not None:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{D}"].index == {index}'}}
        ]
    devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if nvlinked:
        devices["constraints"] = [{"matchAttribute": f"{D}/nvlinkDomain"}]
    return {"metadata": {"name": name}, "spec": {"devices": devices}}


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
        },
    }


def report(kubeconfig: str, ns: str, *more: str) -> dict[str, Any]:
    """The report judged by the Pending pods of `ns`, or of every namespace with "" (where
    another test's, still going away, may want the same GPUs)."""
    out = io.StringIO()
    scope = ["-n", ns, *more] if ns else list(more)
    with redirect_stdout(out):
        assert (
            main(
                [
                    "fleet",
                    "--kubeconfig",
                    kubeconfig,
                    *scope,
                    "-o",
                    "json",
                    "--price-per-gpu-hour",
                    "3",
                ]
            )
            == 0
        )
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def test_fleet_says_what_the_scheduler_then_does(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> None:
    ensure_device_classes(kube)
    kubelet = hollow_node()
    node = kubelet.node
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:4xA100-80GB:nvlink=pairs")
    plugin.start()
    try:
        wait_for(plugin.ready, "the plugin", 30)
        ns = namespace
        pods = path_for("v1", "pods", ns)

        def run(name: str, claim: dict[str, Any]) -> None:
            kube.create(path_for(RES, "resourceclaims", ns), claim)
            kube.create(pods, pod(name, node))

        def phase(name: str) -> str:
            return str(
                (get_or_none(kube, path_for("v1", "pods", ns, name=name)) or {})
                .get("status", {})
                .get("phase")
            )

        def unschedulable(name: str) -> bool:
            p = get_or_none(kube, path_for("v1", "pods", ns, name=name)) or {}
            return any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in p.get("status", {}).get("conditions") or []
            )

        # One GPU of each NVLink pair taken (GPUs 0 and 2).
        run("first", gpu_claim("first", 1, index=0))
        run("third", gpu_claim("third", 1, index=2))
        wait_for(lambda: phase("first") == phase("third") == "Running", "both pods running", 60)
        mine = lambda r: next(v for v in r["nodes"] if v["node"] == node)  # noqa: E731
        before = mine(report(cluster.kubeconfig, ns))
        assert before["largest"] == 2 and before["largestNVLinked"] == 1
        assert "2 GPUs" in before["fits"] and "2 NVLinked" not in before["fits"]
        # The scheduler agrees: two NVLinked GPUs do not fit, any two do.
        run("pair", gpu_claim("pair", 2, nvlinked=True))
        wait_for(lambda: unschedulable("pair"), "the NVLinked pair unschedulable", 60)
        # Another team's Pending pod that any one GPU would serve (held off every node
        # by its selector): across the fleet our free GPUs are of use to someone, in
        # this namespace they are stranded.
        other = f"{ns}-other"
        kube.create(path_for("v1", "namespaces"), {"metadata": {"name": other}})
        try:
            kube.create(path_for(RES, "resourceclaims", other), gpu_claim("any", 1))
            held = pod("any", "no-such-node")
            kube.create(path_for("v1", "pods", other), held)
            everyone = [s for s in report(cluster.kubeconfig, "")["stranded"] if s["node"] == node]
            assert everyone == [], everyone
        finally:
            kube.delete(path_for("v1", "namespaces", name=other), missing_ok=True)
        picture = kubelet.root.parent / "fleet.html"
        r = report(cluster.kubeconfig, ns, "--html", str(picture))
        stranded = [s for s in r["stranded"] if s["node"] == node]
        # The picture says the same of this node: GPUs 0 and 2 held by their pods' claims,
        # 1 and 3 stranded.
        row = re.search(rf'<tr data-node="{node}">(.*?)</tr>', picture.read_text(), re.S)
        assert row is not None, picture.read_text()[-3000:]
        cells = re.findall(r'data-state="(\w+)" title="([^"]*)"', row.group(1))
        assert [state for state, _ in cells] == ["allocated", "stranded", "allocated", "stranded"]
        assert f"{ns}/first" in cells[0][1] and f"{ns}/third" in cells[2][1]
        assert [(s["gpus"], s["reason"]) for s in stranded] == [(2, "fragmented-nvlink")], stranded
        assert f"claim {ns}/pair needs 2 in one" in stranded[0]["detail"]
        assert r["costPerHour"] >= 6.0
        run("any-two", gpu_claim("any-two", 2))
        wait_for(lambda: phase("any-two") == "Running", "the pod for any two GPUs running", 60)
        assert phase("pair") == "Pending"
        after = mine(report(cluster.kubeconfig, ns))
        (product,) = after["products"].values()
        assert (product["allocated"], product["free"]) == (4, 0) and after["fits"] == []
        for name in ("first", "third", "pair", "any-two"):
            kube.delete(path_for("v1", "pods", ns, name=name), grace_period=0)
        wait_for(lambda: not kube.list(pods).get("items"), "the pods gone", 60)
    finally:
        plugin.stop()
