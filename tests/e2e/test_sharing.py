"""The sharing examples end to end (P5): the real scheduler, the simulator, the plugin;
each container gets what its claim's config says, and once every pod is gone no daemon,
compute-mode change or CDI file remains."""

from __future__ import annotations

import contextlib
import io
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver import cli
from dradriver.k8s import Kube, path_for
from fakenvml import load
from tests.support.local_daemons import process_alive

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
        """The MPS daemons' processes that run (the stand-in writes its PID as its control
        file), whoever started them."""
        pids = [int(p.read_text()) for p in (self.plugin.state_dir / "mps").glob("*/pipe/control")]
        return [p for p in pids if process_alive(p)]

    def leftovers(self) -> dict[str, Any]:
        m = self.machine()
        return {
            "cdi": sorted(p.name for p in self.kubelet.cdi_dir.glob("*-claim-*.json")),
            "daemons": self.daemons() + [p["metadata"]["name"] for p in self.daemon_pods()],
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
    # The daemon is a pod of its own on the node, which its runtime runs.
    (pod,) = node.daemon_pods("mps")
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == node.kubelet.node
    assert 3 in [g.compute_mode for g in node.machine().gpus]  # EXCLUSIVE_PROCESS
    # The daemon outlives a plugin restart: the same pod, the same process.
    node.plugin.stop()
    assert process_alive(pid)
    node.plugin.start()
    wait_for(node.plugin.ready, "the restarted plugin", 30)
    assert node.daemons() == [pid]
    assert [p["metadata"]["uid"] for p in node.daemon_pods("mps")] == [pod["metadata"]["uid"]]
    node.delete(*pods)
    assert not process_alive(pid)
    assert node.leftovers() == {"cdi": [], "daemons": [], "compute modes": [], "MIG devices": []}


UNSHARE = ("unshare", "--pid", "--fork", "--kill-child")


def test_mps_daemon_outlives_a_plugin_killed_in_its_own_pid_namespace(node: SharedNode) -> None:
    """Q20: the plugin as the chart runs it, the init of its own PID namespace (a
    container's), killed with SIGKILL: the kernel ends everything in that namespace, and
    a daemon the plugin had started itself went with it. Its daemon pod runs on, the same
    process with its client's connection (the stand-in's heartbeat counts on); the next
    instance, in a new namespace, adopts it by the pod's UID and stops exactly it."""
    node.plugin.stop()
    node.plugin.prefix = UNSHARE
    node.plugin.start()
    wait_for(node.plugin.ready, "the plugin in its own PID namespace", 30)
    pods = node.apply("mps-gpu")
    a = node.running(pods[0])
    node.running(pods[1])
    pipe = Path(node.env(a)["CUDA_MPS_PIPE_DIRECTORY"])
    (pid,) = node.daemons()
    (pod,) = node.daemon_pods("mps")
    beats = heartbeat(pipe)
    node.plugin.stop(signal.SIGKILL)
    assert process_alive(pid)
    wait_for(lambda: heartbeat(pipe) > beats, "the daemon's heartbeat going on", 10)
    node.plugin.start()
    wait_for(node.plugin.ready, "the plugin in a new PID namespace", 30)
    assert node.daemons() == [pid] and process_alive(pid)
    assert [p["metadata"]["uid"] for p in node.daemon_pods("mps")] == [pod["metadata"]["uid"]]
    assert "MPS control daemon of a prepared claim is not serving" not in node.plugin.log()
    node.delete(*pods)
    assert not process_alive(pid)
    assert node.leftovers() == {"cdi": [], "daemons": [], "compute modes": [], "MIG devices": []}


def test_a_deleted_daemon_pod_is_explained_and_made_again(node: SharedNode) -> None:
    """doctor lists the node's daemon pods; with one deleted by hand, explain on a pod of
    its claim says so and how to recover, and the plugin's next start makes it again."""
    pods = node.apply("mps-gpu")
    for p in pods:
        node.running(p)
    (pod,) = node.daemon_pods("mps")
    name = pod["metadata"]["name"]
    said = run_cli(
        "doctor",
        f"--node={node.kubelet.node}",
        f"--kubeconfig={node.plugin.kubeconfig}",
        f"--devices={node.plugin.devices}",
        f"--state-dir={node.plugin.state_dir}",
        f"--cdi-dir={node.kubelet.cdi_dir}",
        f"--readyz=http://127.0.0.1:{node.plugin.port}/readyz",
        f"--containerd-config={node.kubelet.root / 'none.toml'}",
    )
    assert f"ok    daemons: 1 daemon pod on {node.kubelet.node}: default/{name} (MPS" in said
    node.kube.delete(path_for("v1", "pods", "default", name=name), grace_period=0)
    wait_for(lambda: node.daemons() == [], "the daemon's process ended with its pod", 30)
    said = run_cli(
        "explain", f"pod/{pods[0]}", "-n", node.ns, "--kubeconfig", node.plugin.kubeconfig
    )
    assert "=> daemon: the MPS control daemon claim" in said and "has no pod on" in said, said
    assert "delete its pod" in said
    node.plugin.stop()
    node.plugin.start()
    wait_for(node.plugin.ready, "the restarted plugin", 30)
    (again,) = node.daemon_pods("mps")
    assert again["metadata"]["name"] == name and again["metadata"]["uid"] != pod["metadata"]["uid"]
    assert len(node.daemons()) == 1
    said = run_cli(
        "explain", f"pod/{pods[0]}", "-n", node.ns, "--kubeconfig", node.plugin.kubeconfig
    )
    assert "daemon:" not in said, said
    node.delete(*pods)
    assert node.leftovers() == {"cdi": [], "daemons": [], "compute modes": [], "MIG devices": []}


def run_cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        cli.main(list(argv))
    return out.getvalue()


def heartbeat(pipe: Path) -> int:
    """What the stand-in MPS daemon's clients see of it: a counter it raises while it runs."""
    try:
        return int((pipe / "heartbeat").read_text() or 0)
    except (OSError, ValueError):
        return 0


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
