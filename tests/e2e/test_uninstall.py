"""An uninstall leaves nothing on the node; a restart keeps everything.

The plugin reads its own DaemonSet at a graceful stop (--owner-daemonset, which the chart
sets): gone or being deleted means the driver is leaving, and the plugin then removes
what it wrote in its state directory, unless a claim is still prepared there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.k8s import Kube, path_for
from tests.e2e.helpers import (
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    wait_for,
)

DAEMONSET = {
    "metadata": {"name": "plugin"},
    "spec": {
        "selector": {"matchLabels": {"app": "plugin"}},
        # Never scheduled anywhere: the process below stands for its pod.
        "template": {
            "metadata": {"labels": {"app": "plugin"}},
            "spec": {
                "nodeSelector": {"dradriver.io/e2e": "never"},
                "containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    },
}


def owned_files(state: Path) -> list[str]:
    return sorted(str(p.relative_to(state)) for p in state.rglob("*")) if state.exists() else []


def start(cluster: Cluster, kubelet: HollowNode, owner: str) -> PluginProc:
    plugin = PluginProc(
        cluster.kubeconfig,
        kubelet,
        "fake:2xH100-80GB",
        extra_args=["--owner-daemonset", owner],
    )
    plugin.start()
    wait_for(plugin.ready, "the plugin to be ready", 30)
    return plugin


@pytest.fixture
def owned_node(kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]) -> HollowNode:
    """A hollow node, and the DaemonSet `<namespace>/plugin` its plugin names as owner."""
    ensure_device_classes(kube)
    kube.create(path_for("apps/v1", "daemonsets", namespace), DAEMONSET)
    return hollow_node()


def test_the_state_goes_with_the_daemonset_and_stays_with_it(
    cluster: Cluster, kube: Kube, namespace: str, owned_node: HollowNode
) -> None:
    kubelet = owned_node
    owner = f"{namespace}/plugin"
    plugin = start(cluster, kubelet, owner)
    state = plugin.state_dir
    written = owned_files(state)
    assert "checkpoint.json" in written and "device-names.json" in written
    # A restart (the DaemonSet is there): everything stays.
    plugin.stop()
    assert owned_files(state) == written
    assert "keeping its state" not in plugin.log()
    # The uninstall: the DaemonSet is deleted, then its pod stopped.
    plugin = start(cluster, kubelet, owner)
    kube.delete(path_for("apps/v1", "daemonsets", namespace, name="plugin"))
    plugin.stop()
    assert owned_files(state) == [], plugin.log()
    assert "its state is removed" in plugin.log()
    # Nothing in the kubelet's directories either.
    assert not list(kubelet.registry_dir.glob("gpu.dradriver.io*"))
    assert not (kubelet.plugins_dir / "gpu.dradriver.io").exists()


def test_an_uninstall_with_a_claim_still_prepared_keeps_the_state(
    cluster: Cluster, kube: Kube, namespace: str, owned_node: HollowNode
) -> None:
    plugin = start(cluster, owned_node, f"{namespace}/plugin")
    node = NodeUnderTest(kube, namespace, owned_node, plugin)
    (pod,) = node.apply("gpu-by-product")
    node.running(pod)
    kube.delete(path_for("apps/v1", "daemonsets", namespace, name="plugin"))
    plugin.stop()
    assert "checkpoint.json" in owned_files(plugin.state_dir)
    assert "1 claims are still prepared here" in plugin.log()
