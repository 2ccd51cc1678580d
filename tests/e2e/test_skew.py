"""Version skew: a kubelet up to three minors older than the API server is an ordinary
state (upgrades go control plane first), so a 1.34 kubelet on a newer control plane
prepares and releases claims, whole GPUs and dynamic MIG partitions, through the plugin
that lays its slices out for the newer API server."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from dradriver.k8s import Kube, path_for
from dradriver.k8s.lines import OLDEST

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    new_namespace,
    wait_for,
)


@pytest.fixture
def old_kubelet_node(
    alpha_cluster: Cluster, alpha_kube: Kube, hollow_node: Callable[..., HollowNode]
) -> Iterator[NodeUnderTest]:
    if alpha_cluster.line.minor == OLDEST.minor:
        pytest.skip(f"no line older than {OLDEST.name} to run a kubelet of")
    k = alpha_kube
    ensure_device_classes(k)
    kubelet = hollow_node(
        kubeconfig=alpha_cluster.kubeconfig, api=k, extra_args=["--kubernetes", OLDEST.name]
    )
    plugin = PluginProc(alpha_cluster.kubeconfig, kubelet, "fake:2xH100-80GB", "dynamic")
    plugin.start()
    ns = new_namespace(k, f"skew-{secrets.token_hex(3)}")
    try:
        wait_for(plugin.ready, "the plugin to be ready", 30)
        yield NodeUnderTest(k, ns, kubelet, plugin)
    finally:
        plugin.stop()
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def test_an_older_kubelet_prepares_and_releases_claims(
    alpha_cluster: Cluster, old_kubelet_node: NodeUnderTest
) -> None:
    n = old_kubelet_node
    node = n.kube.get(path_for("v1", "nodes", name=n.kubelet.node))
    assert node["status"]["nodeInfo"]["kubeletVersion"] == OLDEST.release
    server = n.kube.get("/version")["gitVersion"]
    assert server == alpha_cluster.line.release != OLDEST.release
    # The slices are the newer server's layout: counter sets apart from 1.35.
    slices = n.kube.list(
        path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={n.kubelet.node}"
    )["items"]
    assert any(s["spec"].get("sharedCounters") and not s["spec"].get("devices") for s in slices)

    (whole,) = n.apply("gpu-by-product")
    n.claim_and_pod("part", 'device.attributes["gpu.dradriver.io"].profile == "1g.10gb"')
    for pod in (whole, "part"):
        got = n.running(pod)
        assert n.record(got)["cdiDevices"], pod  # the runtime resolved the plugin's CDI IDs
    assert len(n.checkpoint_claims()) == 2
    n.delete(whole, "part")
    wait_for(lambda: not n.checkpoint_claims(), "both claims unprepared", 30)
    assert not list(n.kubelet.cdi_dir.glob("*-claim-*.json")), "a CDI spec was left behind"
