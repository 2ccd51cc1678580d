"""The sharing examples end to end (P5): the real scheduler, the simulator, the plugin;
each container gets what its claim's config says, and once every pod is gone no daemon,
compute-mode change or CDI file remains."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, path_for
from dradriver.nvml.host import mps_alive
from fakenvml import load

from .helpers import (
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    get_or_none,
    wait_for,
)


class SharedNode(NodeUnderTest):
    def __init__(
        self, kube: Kube, ns: str, kubelet: HollowNode, plugin: PluginProc, spec: str
    ) -> None:
        super().__init__(kube, ns, kubelet, plugin)
        self.spec = spec

    def machine(self) -> Any:
        return load(self.spec, node=self.kubelet.node, state_dir=self.plugin.state_dir).machine

    def daemons(self) -> list[int]:
        return [int(p.read_text()) for p in (self.plugin.state_dir / "mps").glob("*/pipe/control")]

    def leftovers(self) -> dict[str, Any]:
        m = self.machine()
        return {
            "cdi": sorted(p.name for p in self.kubelet.cdi_dir.glob("*-claim-*.json")),
            "daemons": [p for p in self.daemons() if mps_alive(p)],
            "compute modes": [g.compute_mode for g in m.gpus if g.compute_mode != 0],
            "MIG devices": [gi.profile.name for g in m.gpus for gi in g.gpu_instances.values()],
        }


def shared_node(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    hollow_node: Callable[..., HollowNode],
    spec: str,
    mode: str,
) -> Iterator[SharedNode]:
    ensure_device_classes(kube)
    kubelet = hollow_node(kubeconfig=cluster.kubeconfig, api=kube)
    plugin = PluginProc(cluster.kubeconfig, kubelet, f"fake:{spec}", mode)
    plugin.start()
    node = SharedNode(kube, namespace, kubelet, plugin, spec)
    try:
        wait_for(plugin.ready, "the plugin", 30)
        yield node
    finally:
        # Pods first, so the plugin unprepares (and stops its daemons) before it goes.
        pods = [
            p["metadata"]["name"] for p in kube.list(path_for("v1", "pods", namespace))["items"]
        ]
        node.delete(*pods)
        plugin.stop()


@pytest.fixture
def node(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> Iterator[SharedNode]:
    yield from shared_node(cluster, kube, namespace, hollow_node, "2xA100-80GB", "none")


def test_one_gpu_time_sliced_between_two_pods(node: SharedNode) -> None:
    pods = node.apply("time-sliced-gpu")
    a, b = (node.running(p) for p in pods)
    assert node.env(a)["NVIDIA_VISIBLE_DEVICES"] == node.env(b)["NVIDIA_VISIBLE_DEVICES"]
    uuid = node.env(a)["NVIDIA_VISIBLE_DEVICES"]
    sharing = json.loads(
        (node.plugin.state_dir / f"fake-sharing-{node.kubelet.node}.json").read_text()
    )
    assert sharing[uuid] == {"timeslice": 3}  # interval Long
    node.delete(*pods)
    sharing = json.loads(
        (node.plugin.state_dir / f"fake-sharing-{node.kubelet.node}.json").read_text()
    )
    assert sharing[uuid] == {"timeslice": 0}
    assert node.leftovers() == {"cdi": [], "daemons": [], "compute modes": [], "MIG devices": []}


def test_mps_with_limits_shared_by_two_pods(node: SharedNode) -> None:
    pods = node.apply("mps-gpu")
    a, b = (node.running(p) for p in pods)
    ea, eb = node.env(a), node.env(b)
    assert ea["NVIDIA_VISIBLE_DEVICES"] == eb["NVIDIA_VISIBLE_DEVICES"]
    assert ea["CUDA_MPS_PIPE_DIRECTORY"] == eb["CUDA_MPS_PIPE_DIRECTORY"]
    assert ea["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert ea["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{ea['NVIDIA_VISIBLE_DEVICES']}=10240M"
    mounts = {m["containerPath"]: m["hostPath"] for m in node.record(a)["mounts"]}
    assert ea["CUDA_MPS_PIPE_DIRECTORY"] in mounts and ea["CUDA_MPS_LOG_DIRECTORY"] in mounts
    # Both pods get the daemon's /dev/shm, where MPS server and clients exchange memory.
    others = {m["containerPath"]: m["hostPath"] for m in node.record(b)["mounts"]}
    assert mounts["/dev/shm"] == others["/dev/shm"]
    assert (Path(mounts["/dev/shm"]) / "cuda.shm.mps-server").exists()
    (pid,) = node.daemons()
    assert mps_alive(pid)
    assert 3 in [g.compute_mode for g in node.machine().gpus]  # EXCLUSIVE_PROCESS
    # The daemon outlives a plugin restart.
    node.plugin.stop()
    assert mps_alive(pid)
    node.plugin.start()
    wait_for(node.plugin.ready, "the restarted plugin", 30)
    assert node.daemons() == [pid]
    node.delete(*pods)
    assert not mps_alive(pid)
    assert node.leftovers() == {"cdi": [], "daemons": [], "compute modes": [], "MIG devices": []}


def test_mig_device_shared_by_two_containers(
    alpha_cluster: Cluster, alpha_kube: Kube, hollow_node: Callable[..., HollowNode]
) -> None:
    ns = "shared-mig"
    k = alpha_kube
    k.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    wait_for(
        lambda: get_or_none(k, path_for("v1", "serviceaccounts", ns, name="default")),
        "the default ServiceAccount",
        30,
    )
    try:
        for node in shared_node(alpha_cluster, k, ns, hollow_node, "1xH100-80GB", "dynamic"):
            (pod,) = node.apply("mig-shared-by-containers")
            p = node.running(pod)
            t, e = node.env(p, "trainer"), node.env(p, "evaluator")
            assert t["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
            assert t["NVIDIA_VISIBLE_DEVICES"] == e["NVIDIA_VISIBLE_DEVICES"]
            assert t["CUDA_MPS_PIPE_DIRECTORY"] == e["CUDA_MPS_PIPE_DIRECTORY"]
            assert len(node.daemons()) == 1
            node.delete(pod)
            assert node.leftovers() == {
                "cdi": [],
                "daemons": [],
                "compute modes": [],
                "MIG devices": [],
            }
    finally:
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)
