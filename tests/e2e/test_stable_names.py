"""A GPU gone from a node (fallen off the bus before a reboot): the other GPUs keep their
device names though NVML's indices shift, and a claim the scheduler allocated to the gone
GPU is refused by the node, never prepared on the GPU that took its index. Real control
plane, the kubelet's own code, the plugin restarted on a spec with that GPU absent."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dradriver.k8s import Kube, path_for

from .helpers import RES, Cluster, HollowNode, PluginProc, ensure_device_classes, wait_for
from .test_kubelet_plugin import GpuNode

pytestmark = pytest.mark.e2e
FULL, GONE = "fake:4xH100-80GB", "fake:4xH100-80GB:absent=1"


@pytest.fixture
def node(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> Iterator[GpuNode]:
    ensure_device_classes(kube)
    kubelet = hollow_node()
    plugin = PluginProc(cluster.kubeconfig, kubelet, FULL)
    plugin.start()
    n = GpuNode(kube, namespace, kubelet, plugin, cluster)
    try:
        wait_for(plugin.ready, "the plugin to be ready", 30)
        yield n
    finally:
        n.plugin.stop()


def _gpus(n: GpuNode) -> dict[str, dict[str, Any]]:
    """UUID -> the published whole-GPU device."""
    return {
        d["attributes"]["uuid"]["string"]: d
        for s in n.slices()
        for d in s["spec"].get("devices") or []
        if d["attributes"]["type"]["string"] == "gpu"
    }


def _pinned(n: GpuNode, claim: str, uuid: str) -> None:
    n.claim(claim, selector=f'device.attributes["gpu.dradriver.io"].uuid == "{uuid}"')


def _events(n: GpuNode, pod: str) -> list[str]:
    evs = n.kube.list(path_for("v1", "events", n.ns), fieldSelector=f"involvedObject.name={pod}")[
        "items"
    ]
    return [e["message"] for e in evs if e["reason"] == "FailedPrepareDynamicResources"]


def test_a_gone_gpu_keeps_the_others_names_and_its_claim_is_refused(node: GpuNode) -> None:
    n = node
    before = _gpus(n)
    by_index = {d["attributes"]["index"]["int"]: u for u, d in before.items()}
    kept, lost = by_index[2], by_index[1]
    _pinned(n, "kept", kept)
    n.pod("kept", claim="kept")
    n.running("kept")
    # The plugin dies; the scheduler allocates the GPU of index 1 from the slices still
    # published, and the kubelet cannot prepare it until a plugin answers again.
    n.plugin.stop(signal.SIGKILL)
    _pinned(n, "late", lost)
    n.pod("late", claim="late")
    wait_for(
        lambda: (
            n.kube.get(path_for(RES, "resourceclaims", n.ns, name="late"))
            .get("status", {})
            .get("allocation")
        ),
        "the claim to be allocated",
        30,
    )
    # The node comes back without that GPU: NVML's index 1 is the GPU that was index 2.
    n.plugin.devices = GONE
    n.plugin.start()
    wait_for(n.plugin.ready, "the restarted plugin", 30)
    after = wait_for(lambda: g if len(g := _gpus(n)) == 3 else None, "3 GPUs published", 20)
    assert set(after) == set(before) - {lost}
    for uuid, d in after.items():
        assert d["name"] == before[uuid]["name"]  # same GPU, same name
    assert after[kept]["attributes"]["index"]["int"] == 1  # its index shifted
    lost_name = before[lost]["name"]
    messages = wait_for(
        lambda: [m for m in _events(n, "late") if "does not have now" in m],
        "the kubelet to report the refusal",
        60,
    )
    assert f"device {lost_name} is GPU {lost} (NVIDIA H100 80GB HBM3, " in messages[0]
    # Prepared nowhere: no record, no CDI spec, the pod does not run.
    late_uid = n.kube.get(path_for(RES, "resourceclaims", n.ns, name="late"))["metadata"]["uid"]
    assert late_uid not in n.checkpoint_claims()
    assert not [s for s in n.cdi_specs() if late_uid in s]
    pod = n.kube.get(path_for("v1", "pods", n.ns, name="late"))
    assert pod["status"].get("phase") == "Pending"
    # The claim prepared before keeps its GPU and unprepares cleanly.
    kept_uid = n.kube.get(path_for(RES, "resourceclaims", n.ns, name="kept"))["metadata"]["uid"]
    assert n.checkpoint_claims()[kept_uid]["devices"][0]["device"] == before[kept]["name"]
    n.delete("kept", "late")
    wait_for(lambda: n.checkpoint_claims() == {}, "every claim unprepared", 30)
    assert n.cdi_specs() == []
