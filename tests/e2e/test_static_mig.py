"""Static MIG mode on a node whose admin split a GPU instance into compute instances (the
MIG User Guide's `-cci 0,0,0` example): the real scheduler hands each compute instance to
a different claim, and the real kubelet runs both pods on the same GPU instance."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dradriver.k8s import Kube, path_for

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    wait_for,
)

FLEET = Path(__file__).resolve().parents[1] / "data" / "multi-ci.yaml"
DRIVER = "gpu.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"


@pytest.fixture
def mig_node(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> Iterator[NodeUnderTest]:
    ensure_device_classes(kube)
    kubelet = hollow_node()
    plugin = PluginProc(cluster.kubeconfig, kubelet, f"fake:@{FLEET}", "static")
    plugin.start()
    try:
        wait_for(plugin.ready, "the plugin", 30)
        yield NodeUnderTest(kube, namespace, kubelet, plugin)
    finally:
        plugin.stop()


def test_each_compute_instance_goes_to_its_own_claim(mig_node: NodeUnderTest) -> None:
    n = mig_node
    selector = f'device.attributes["{DRIVER}"].profile == "1c.3g.40gb"'
    for name in ("a", "b"):
        n.claim_and_pod(name, selector, request="ci")
    running = [n.running(name) for name in ("a", "b")]
    devices = [
        n.kube.get(path_for(RES, "resourceclaims", n.ns, name=c))["status"]["allocation"][
            "devices"
        ]["results"][0]["device"]
        for c in ("a", "b")
    ]
    assert sorted(devices) != [devices[0]] * 2
    assert all(d.startswith(n.real("gpu-0-mig-3g40gb-4-ci")) for d in devices)
    visible = {n.env(p)["NVIDIA_VISIBLE_DEVICES"] for p in running}
    assert len(visible) == 2 and all(v.startswith("MIG-") for v in visible)
    n.delete("a", "b")
    wait_for(
        lambda: not list(n.kubelet.cdi_dir.glob("*-claim-*.json")), "both claims unprepared", 15
    )
