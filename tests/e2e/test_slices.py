"""Slices from fake GPUs are accepted by the real API server and the real scheduler
allocates every example claim as intended (P2)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dradriver.inventory.naming import uuid_digits
from dradriver.k8s import Kube, path_for
from dradriver.k8s.lines import OLDEST, Line
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import MigMode, build
from dradriver.slices.publish import SlicePublisher

from .helpers import (
    REPO,
    RES,
    Cluster,
    HollowNode,
    create_objects,
    ensure_device_classes,
    get_or_none,
    load_yaml,
    wait_for,
)

DRIVER = "gpu.dradriver.io"
EXAMPLES = REPO / "examples" / "claims"


@dataclass
class Fleet:
    kube: Kube
    nodes: dict[str, HollowNode]  # role -> simulated node
    publishers: dict[str, SlicePublisher]

    def device(self, result: dict[str, Any]) -> dict[str, Any]:
        slices = self.kube.list(
            path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={result['pool']}"
        )["items"]
        return next(
            d
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] == result["device"]
        )


def publish(
    kube: Kube, kubelet: HollowNode, spec: str, mode: MigMode, ln: Line = OLDEST
) -> SlicePublisher:
    inv = open_nvml(f"fake:{spec}", node=kubelet.node, state_dir=None).discover().inventory
    pub = SlicePublisher(kube, DRIVER, kubelet.node)
    stats = pub.sync(build(inv, mode, line=ln).slices)
    assert stats.created >= 1 and stats.generation == 1
    return pub


@pytest.fixture
def fleet(cluster: Cluster, kube: Kube, hollow_node: Callable[..., HollowNode]) -> Iterator[Fleet]:
    ensure_device_classes(kube)
    h100, mixed = hollow_node(), hollow_node()
    pubs = {
        "h100": publish(kube, h100, "8xH100-80GB", MigMode.NONE, cluster.line),
        "mixed": publish(kube, mixed, "4xA100-80GB:nvlink=pairs+2xL4", MigMode.NONE, cluster.line),
    }
    yield Fleet(kube, {"h100": h100, "mixed": mixed}, pubs)


def claim_of(kube: Kube, ns: str, pod: str, timeout: float = 30) -> dict[str, Any]:
    """The pod's template-generated claim, once the scheduler has allocated it."""

    def allocated() -> dict[str, Any] | None:
        p = get_or_none(kube, path_for("v1", "pods", ns, name=pod))
        statuses = (p or {}).get("status", {}).get("resourceClaimStatuses") or []
        if not statuses:
            return None
        c = get_or_none(
            kube, path_for(RES, "resourceclaims", ns, name=statuses[0]["resourceClaimName"])
        )
        return c if c and (c.get("status") or {}).get("allocation") else None

    return wait_for(allocated, f"the claim of pod {pod} to be allocated", timeout)


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim["status"]["allocation"]["devices"]["results"])


def example(
    kube: Kube,
    ns: str,
    name: str,
    node: str | None = None,
    mutate: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    def pin(doc: dict[str, Any]) -> None:
        if doc["kind"] == "Pod" and node:
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        if mutate:
            mutate(doc)

    docs = create_objects(kube, load_yaml(EXAMPLES / f"{name}.yaml"), ns, pin)
    return str(next(d for d in docs if d["kind"] == "Pod")["metadata"]["name"])


def attr(dev: dict[str, Any], name: str) -> Any:
    return next(iter(dev["attributes"][name].values()))


def test_slices_are_accepted_with_pool_bookkeeping_and_owner(
    cluster: Cluster, fleet: Fleet
) -> None:
    for role, kubelet in fleet.nodes.items():
        slices = fleet.kube.list(
            path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={kubelet.node}"
        )["items"]
        assert len(slices) == 1, role
        s = slices[0]
        assert s["spec"]["pool"] == {"name": kubelet.node, "generation": 1, "resourceSliceCount": 1}
        owner = s["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Node", kubelet.node, True)
    # Nothing changed: no write at all.
    assert (
        fleet.publishers["h100"]
        .sync(
            build(
                open_nvml("fake:8xH100-80GB", node=fleet.nodes["h100"].node, state_dir=None)
                .discover()
                .inventory,
                MigMode.NONE,
                line=cluster.line,
            ).slices
        )
        .writes
        == 0
    )


def test_gpu_by_product_memory_and_compute_capability(fleet: Fleet, namespace: str) -> None:
    k = fleet.kube
    pod = example(k, namespace, "gpu-by-product")
    (r,) = results(claim_of(k, namespace, pod))
    assert attr(fleet.device(r), "productName") == "NVIDIA H100 80GB HBM3"

    # >= 40Gi on the mixed node: an A100, never an L4 (24 GB).
    pod = example(k, namespace, "gpu-by-memory", node=fleet.nodes["mixed"].node)
    (r,) = results(claim_of(k, namespace, pod))
    assert attr(fleet.device(r), "productName") == "NVIDIA A100-SXM4-80GB"

    # Compute capability >= 9.0 is compared as a version: only the H100s qualify.
    pod = example(k, namespace, "gpu-by-compute-capability")
    (r,) = results(claim_of(k, namespace, pod))
    assert r["pool"] == fleet.nodes["h100"].node
    assert attr(fleet.device(r), "cudaComputeCapability") == "9.0.0"


def test_four_nvlinked_gpus_never_span_domains(fleet: Fleet, namespace: str) -> None:
    k = fleet.kube
    pod = example(k, namespace, "four-nvlinked-gpus")
    rs = results(claim_of(k, namespace, pod))
    assert len(rs) == 4
    devs = [fleet.device(r) for r in rs]
    assert len({attr(d, "nvlinkDomain") for d in devs}) == 1
    assert {attr(d, "productName") for d in devs} == {"NVIDIA H100 80GB HBM3"}

    # On the mixed node the A100s come in NVLink pairs and the L4s have no NVLink:
    # four GPUs in one domain do not exist there, so the pod must stay unscheduled.
    pod = example(
        k, namespace, "four-nvlinked-gpus", node=fleet.nodes["mixed"].node, mutate=_rename("split")
    )
    time.sleep(3)
    p = k.get(path_for("v1", "pods", namespace, name=pod))
    assert not p["spec"].get("nodeName")
    cond = next(c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"

    # Two GPUs in one domain do exist there: one A100 pair.
    pod = example(
        k, namespace, "four-nvlinked-gpus", node=fleet.nodes["mixed"].node, mutate=_two("pair")
    )
    devs = [fleet.device(r) for r in results(claim_of(k, namespace, pod))]
    assert len(devs) == 2 and len({attr(d, "nvlinkDomain") for d in devs}) == 1
    assert {attr(d, "productName") for d in devs} == {"NVIDIA A100-SXM4-80GB"}


def test_prioritized_list_takes_h100_first_and_a100_otherwise(fleet: Fleet, namespace: str) -> None:
    k = fleet.kube
    pod = example(k, namespace, "prioritized-list", node=fleet.nodes["h100"].node)
    (r,) = results(claim_of(k, namespace, pod))
    assert r["request"] == "gpu/h100"
    pod = example(
        k, namespace, "prioritized-list", node=fleet.nodes["mixed"].node, mutate=_rename("fallback")
    )
    (r,) = results(claim_of(k, namespace, pod))
    assert r["request"] == "gpu/a100"
    assert attr(fleet.device(r), "productName") == "NVIDIA A100-SXM4-80GB"


def _rename(suffix: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["metadata"]["name"] += f"-{suffix}"
        for rc in doc.get("spec", {}).get("resourceClaims", []):
            rc["resourceClaimTemplateName"] += f"-{suffix}"

    return mutate


def _two(suffix: str) -> Callable[[dict[str, Any]], None]:
    rename = _rename(suffix)

    def mutate(doc: dict[str, Any]) -> None:
        rename(doc)
        if doc["kind"] == "ResourceClaimTemplate":
            doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2

    return mutate


# -- dynamic MIG on the alpha cluster -------------------------------------------------------
def test_dynamic_mig_partitions_never_overlap(
    alpha_cluster: Cluster, alpha_kube: Kube, hollow_node: Callable[..., HollowNode]
) -> None:
    k = alpha_kube
    ensure_device_classes(k)
    kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
    publish(k, kubelet, "1xH100-80GB", MigMode.DYNAMIC, alpha_cluster.line)
    stored = k.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={kubelet.node}")[
        "items"
    ]
    # From 1.35 the counter set is in a slice of its own ("counters-0", listed first).
    stored = [s for s in stored if s["spec"].get("sharedCounters")]
    # The gate kept them: GPU 0's counter set, named after its UUID.
    (gpu,) = (
        open_nvml("fake:1xH100-80GB", node=kubelet.node, state_dir=None).discover().inventory.gpus
    )
    assert stored[0]["spec"]["sharedCounters"][0]["name"] == f"gpu-{uuid_digits(gpu.uuid)[:8]}"
    ns = f"mig-{kubelet.node}"
    k.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    wait_for(
        lambda: get_or_none(k, path_for("v1", "serviceaccounts", ns, name="default")),
        "the default ServiceAccount",
        30,
    )
    try:

        def three_g(i: int) -> Callable[[dict[str, Any]], None]:
            def mutate(doc: dict[str, Any]) -> None:
                _rename(f"3g-{i}")(doc)
                if doc["kind"] == "ResourceClaimTemplate":
                    sel = doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
                    sel[0]["cel"]["expression"] = (
                        'device.attributes["gpu.dradriver.io"].profile == "3g.40gb"'
                    )

            return mutate

        pods = [example(k, ns, "mig-1g10gb", node=kubelet.node, mutate=three_g(i)) for i in (0, 1)]
        placed = sorted(
            int(_dev(k, r)["name"].rsplit("-", 1)[1])  # gpu-0-mig-3g40gb-4: placed at 4
            for p in pods
            for r in results(claim_of(k, ns, p))
        )
        assert placed == [0, 4]  # the only two 3g placements that do not overlap

        # A third 3g and a whole GPU cannot fit beside them: the counters say no.
        third = example(k, ns, "mig-1g10gb", node=kubelet.node, mutate=three_g(2))
        whole = example(k, ns, "gpu-by-product", node=kubelet.node, mutate=_rename("whole"))
        time.sleep(3)
        for p in (third, whole):
            pod = k.get(path_for("v1", "pods", ns, name=p))
            assert not pod["spec"].get("nodeName"), p
        # A 1g still fits? No: 3g@0 and 3g@4 cover all 8 memory slices.
        small = example(k, ns, "mig-1g10gb", node=kubelet.node, mutate=_rename("small"))
        time.sleep(2)
        assert not k.get(path_for("v1", "pods", ns, name=small))["spec"].get("nodeName")
    finally:
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def _dev(k: Kube, result: dict[str, Any]) -> dict[str, Any]:
    slices = k.list(
        path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={result['pool']}"
    )["items"]
    return next(
        d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == result["device"]
    )
