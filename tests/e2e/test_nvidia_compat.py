"""Workloads written for NVIDIA's DRA driver run unchanged under the chart's
nvidiaCompatible: true (the driver gpu.nvidia.com, its classes gpu.nvidia.com and
mig.nvidia.com, its config API resource.nvidia.com/v1beta1): each manifest of
examples/nvidia-quickstart/ (the shape of NVIDIA's quickstart specs, written here) is
created as it is, but for a nodeSelector onto the test's node, and its containers get
the GPUs, MIG devices and sharing it asks for. NVIDIA's dcgm-exporter attributes GPU
metrics to pods from the kubelet's PodResources API and the driver's ResourceSlices; the
last test follows its documented steps and finds each container's GPUs."""

from __future__ import annotations

import contextlib
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from dradriver.api import kubelet as kapi
from dradriver.k8s import Conflict, Kube, path_for

from .helpers import (
    REPO,
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    load_yaml,
    run_helm,
    wait_for,
)

DRIVER = "gpu.nvidia.com"
EXAMPLES = REPO / "examples" / "nvidia-quickstart"
CHART = REPO / "deploy" / "helm" / "dradriver"
PLURALS = {
    "Namespace": "namespaces",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "Pod": "pods",
    "Deployment": "deployments",
}


class CompatNode(NodeUnderTest):
    """A hollow node whose plugin runs as NVIDIA's driver name, with A100 40GB GPUs in
    dynamic MIG mode (what gpu-test4's profiles and gpu-test6's selector want)."""

    def create(self, manifest: str) -> str:
        """Creates examples/nvidia-quickstart/<manifest>, each pod pinned to this node;
        returns its namespace."""
        namespace = ""
        for doc in load_yaml(EXAMPLES / manifest):
            kind = doc["kind"]
            spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc.get("spec")
            if kind in ("Pod", "Deployment"):
                spec["nodeSelector"] = {"kubernetes.io/hostname": self.kubelet.node}
            if kind == "Namespace":
                namespace = doc["metadata"]["name"]
            ns = doc["metadata"].get("namespace")
            self.kube.create(path_for(doc["apiVersion"], PLURALS[kind], ns), doc)
        return namespace

    def pods(self, namespace: str, count: int) -> list[dict[str, Any]]:
        def running() -> list[dict[str, Any]] | None:
            items = self.kube.list(path_for("v1", "pods", namespace))["items"]
            up = [p for p in items if p.get("status", {}).get("phase") == "Running"]
            return up if len(up) == count else None

        return wait_for(running, f"{count} pods of {namespace} running", 90)

    def gpus(self, pod: dict[str, Any], container: str) -> set[str]:
        """What the container was given: NVIDIA_VISIBLE_DEVICES's UUIDs."""
        return set(self.env(pod, container)["NVIDIA_VISIBLE_DEVICES"].split(","))

    def remove(self, *namespaces: str) -> None:
        for ns in namespaces:
            self.kube.delete(path_for("v1", "namespaces", name=ns))
        wait_for(lambda: not self.checkpoint_claims(), f"{namespaces}' claims unprepared", 90)


@pytest.fixture(scope="module")
def compat(alpha_cluster: Cluster, helm: Path) -> Iterator[CompatNode]:
    kube = Kube.from_kubeconfig(alpha_cluster.kubeconfig)
    # NVIDIA's classes, as the chart renders them with nvidiaCompatible.
    rendered = run_helm(helm, "template", "x", str(CHART), values={"nvidiaCompatible": True})
    classes = [
        d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DeviceClass"
    ]  # fmt: skip
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= {c["metadata"]["name"] for c in classes}
    for c in classes:
        with contextlib.suppress(Conflict):
            kube.create(path_for(c["apiVersion"], "deviceclasses"), c)
    tmp = Path(tempfile.mkdtemp(prefix="drn-"))
    node = f"nv-{secrets.token_hex(3)}"
    kubelet = HollowNode(alpha_cluster.kubeconfig, node, tmp / node)
    plugin = PluginProc(
        alpha_cluster.kubeconfig,
        kubelet,
        # Whole A100s, and two in MIG mode (an A100 switches it only with a reset:
        # NVIDIA's quickstart partitions its GPUs beforehand too).
        "fake:8xA100-40GB+2xA100-40GB:mig=on",
        "dynamic",
        extra_args=["--driver-name", DRIVER],
    )
    try:
        kubelet.start()
        kubelet.wait_node_ready(kube)
        plugin.start()
        wait_for(plugin.ready, "the plugin to be ready", 30)
        yield CompatNode(kube, "", kubelet, plugin)
    finally:
        plugin.stop()
        kubelet.stop()
        print(f"--- plugin log ---\n{plugin.log()[-4000:]}")
        with contextlib.suppress(Exception):
            kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)
        kube.close()


def test_one_gpu_each_and_one_gpu_shared(compat: CompatNode) -> None:
    """gpu-test1: two pods, a GPU each; gpu-test2: two containers, one GPU; gpu-test3:
    two pods, one claim, one GPU."""
    ns = compat.create("gpu-test1.yaml")
    one, two = compat.pods(ns, 2)
    assert len(compat.gpus(one, "ctr")) == 1 and compat.gpus(one, "ctr") != compat.gpus(two, "ctr")
    compat.remove(ns)
    ns = compat.create("gpu-test2.yaml")
    (pod,) = compat.pods(ns, 1)
    assert compat.gpus(pod, "ctr0") == compat.gpus(pod, "ctr1")
    compat.remove(ns)
    ns = compat.create("gpu-test3.yaml")
    one, two = compat.pods(ns, 2)
    assert compat.gpus(one, "ctr") == compat.gpus(two, "ctr")
    compat.remove(ns)


def test_four_mig_devices_on_one_gpu_per_replica(compat: CompatNode) -> None:
    """gpu-test4: a claim of four MIG devices (1g.5gb twice, 2g.10gb, 3g.20gb) on one
    GPU (matchAttribute gpu.nvidia.com/parentUUID), a container each; carved at prepare."""
    ns = compat.create("gpu-test4.yaml")
    parents = set()
    for pod in compat.pods(ns, 2):
        seen = [compat.gpus(pod, f"ctr{i}") for i in range(4)]
        assert all(len(s) == 1 and next(iter(s)).startswith("MIG-") for s in seen), seen
        assert len(set.union(*seen)) == 4
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = compat.kube.get(
            path_for(RES, "resourceclaims", ns, name=status["resourceClaimName"])
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        names = sorted(r["device"] for r in results)
        assert len(names) == 4 and all("-mig-" in n for n in names)
        # One GPU per replica, whose name starts every device's (gpu-<id>-mig-...).
        (parent,) = {n.split("-mig-")[0] for n in names}
        parents.add(parent)
    assert len(parents) == 2
    compat.remove(ns)


def test_time_slicing_and_mps_configs_of_nvidias_api(compat: CompatNode) -> None:
    """gpu-test5: a time-sliced GPU for two containers, an MPS-shared one for two others;
    gpu-test-mps: MPS at 50% of the SMs with a 10Gi pinned-memory limit."""
    ns = compat.create("gpu-test5.yaml")
    (pod,) = compat.pods(ns, 1)
    ts, mps = compat.gpus(pod, "ts-ctr0"), compat.gpus(pod, "mps-ctr0")
    assert ts == compat.gpus(pod, "ts-ctr1") and mps == compat.gpus(pod, "mps-ctr1") and ts != mps
    env = compat.env(pod, "mps-ctr0")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and "CUDA_MPS_PIPE_DIRECTORY" in env
    assert "CUDA_MPS_PIPE_DIRECTORY" not in compat.env(pod, "ts-ctr0")
    compat.remove(ns)
    ns = compat.create("gpu-test-mps.yaml")
    (pod,) = compat.pods(ns, 1)
    assert compat.gpus(pod, "mps-ctr0") == compat.gpus(pod, "mps-ctr1")
    (gpu,) = compat.gpus(pod, "mps-ctr0")
    assert compat.env(pod, "mps-ctr0")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu}=10240M"
    compat.remove(ns)


def test_a100s_of_even_index_time_sliced(compat: CompatNode) -> None:
    """gpu-test6: four replicas, each a claim for an A100 whose `index` is even (the
    attribute NVIDIA's driver stopped publishing; its own quickstart still selects it)."""
    ns = compat.create("gpu-test6.yaml")
    pods = compat.pods(ns, 4)
    slices = compat.kube.list(
        path_for(RES, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}"
    )
    index = {
        d["attributes"]["uuid"]["string"]: d["attributes"]["index"]["int"]
        for s in slices["items"]
        for d in s["spec"].get("devices") or []
        if d["attributes"].get("type", {}).get("string") == "gpu"
    }
    given = [next(iter(compat.gpus(p, "ctr"))) for p in pods]
    assert sorted(index[g] for g in given) == [0, 2, 4, 6]
    compat.remove(ns)


def dcgm_attribution(kube: Kube, kubelet: HollowNode) -> dict[tuple[str, str], set[str]]:
    """(pod, container) -> GPU UUIDs, as NVIDIA's dcgm-exporter attributes them under DRA:
    the kubelet's PodResources List, its claim resources of driver gpu.nvidia.com by pool
    and device, and in that pool's ResourceSlice the device's `type` and `uuid` (a whole
    GPU) or `parentUUID` (a MIG device, whose metrics are its parent's)."""
    slices = kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}")
    attrs = {
        (s["spec"]["pool"]["name"], d["name"]): {
            k: v.get("string") for k, v in d.get("attributes", {}).items()
        }
        for s in slices["items"]
        for d in s["spec"].get("devices") or []
    }
    sock = kubelet.root / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = kapi.podresources_v1_grpc.PodResourcesListerStub(ch)
        listed = stub.List(kapi.podresources_v1.ListPodResourcesRequest(), timeout=10)
    out: dict[tuple[str, str], set[str]] = {}
    for pod in listed.pod_resources:
        for c in pod.containers:
            for dr in c.dynamic_resources:
                for cr in dr.claim_resources:
                    if cr.driver_name != DRIVER:
                        continue
                    a = attrs.get((cr.pool_name, cr.device_name), {})
                    key = {"gpu": a.get("uuid"), "mig": a.get("parentUUID")}.get(
                        a.get("type") or ""
                    )
                    if key:
                        out.setdefault((pod.name, c.name), set()).add(key)
    return out


def test_dcgm_exporter_finds_each_containers_gpus(compat: CompatNode) -> None:
    ns = compat.create("gpu-test1.yaml")
    pods = compat.pods(ns, 2)
    ns4 = compat.create("gpu-test4.yaml")
    migs = compat.pods(ns4, 2)
    got = dcgm_attribution(compat.kube, compat.kubelet)
    for pod in pods:
        assert got[(pod["metadata"]["name"], "ctr")] == compat.gpus(pod, "ctr")
    # A MIG device's metrics are its GPU's: the GPU of the claim's four partitions.
    slices = compat.kube.list(
        path_for(RES, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}"
    )["items"]
    for pod in migs:
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = compat.kube.get(
            path_for(RES, "resourceclaims", ns4, name=status["resourceClaimName"])
        )
        devices = {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
        parents = {
            d["attributes"]["parentUUID"]["string"]
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] in devices
        }
        assert len(parents) == 1 and next(iter(parents)).startswith("GPU-")
        for i in range(4):
            assert got[(pod["metadata"]["name"], f"ctr{i}")] == parents
    compat.remove(ns, ns4)
