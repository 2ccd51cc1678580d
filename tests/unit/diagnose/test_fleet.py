"""`dradriver fleet` on slices the driver's own code builds from fake GPUs, with claims
and pods as the API server returns them: the counts per node and product, what each
node can still place, and the stranded capacity with its reasons."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.fleet import fleet
from dradriver.diagnose.fleet_claims import held_by_finished, pending_requests
from dradriver.diagnose.fleet_report import as_dict
from dradriver.diagnose.world import build_world
from dradriver.inventory.node_devices import MigMode
from tests.support.explain import CLASSES, D, node, slices

NVLINKED = [{"requests": ["gpus"], "matchAttribute": f"{D}/nvlinkDomain"}]


def claim(
    name: str, count: int, on: tuple[str, list[str]] | None = None, nvlinked: bool = True
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": D, "count": count}}],
                **({"constraints": NVLINKED} if nvlinked else {}),
            }
        },
    }
    if on is not None:
        pool, devices = on
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": D, "pool": pool, "device": d} for d in devices
                    ]
                }
            }
        }
    return c


def pending_pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": claim_name}]},
        "status": {"phase": "Pending"},
    }


def gpu_names(s: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for sl in s for d in sl["spec"]["devices"]]


def test_twelve_nodes_75_percent_busy_strand_24_gpus_from_a_4_gpu_pod() -> None:
    """The issue's fleet: 12 nodes of 8 H100s, two 3-GPU pods on each (72 of 96 busy);
    a 4-GPU pod finds no node, and the 24 free GPUs are stranded, two a node."""
    all_slices, claims, nodes = [], [], []
    for i in range(12):
        n = f"n{i:02d}"
        s = slices(n, "8xH100-80GB")
        names = gpu_names(s)
        all_slices += s
        nodes.append(node(n))
        claims += [claim(f"{n}-a", 3, (n, names[0:3])), claim(f"{n}-b", 3, (n, names[3:6]))]
    claims.append(claim("wide", 4))
    reqs, bad = pending_requests(
        [pending_pod("wide", "wide")], claims, {c["metadata"]["name"]: c for c in CLASSES}
    )
    assert bad == [] and [(r.claim, r.count, r.same_nvlink) for r in reqs] == [
        ("team/wide", 4, True)
    ]
    w = build_world(all_slices, CLASSES, claims, nodes=nodes)
    r = fleet(w, reqs, price=2.5)
    (product,) = r.totals
    t = r.totals[product]
    assert (t.published, t.allocated, t.free) == (96, 72, 24)
    assert r.stranded_gpus == 24 and r.cost_per_hour() == 60.0
    assert {s.node for s in r.stranded} == {f"n{i:02d}" for i in range(12)}
    (first, *_) = r.stranded
    assert (first.gpus, first.reason) == (2, "too-few-free")
    assert first.detail == "the node has 2 free that claim team/wide can take; it needs 4"
    view = r.nodes[0]
    assert (view.largest, view.largest_nvlinked) == (2, 2)
    assert view.shapes() == ["1 GPU", "2 GPUs", "2 NVLinked"]
    out = as_dict(r)
    assert out["strandedGPUs"] == 24 and out["costPerHour"] == 60.0


def test_a_free_node_strands_nothing_and_the_reasons_name_product_and_nvlink() -> None:
    """A node with room places the pod: nothing is stranded there. NVLink pairs with one
    free GPU each fit a 2-GPU claim only without the constraint; L4s no H100 claim wants
    are the wrong product."""
    pairs = slices("p", "4xA100-80GB:nvlink=pairs+2xL4")
    names = gpu_names(pairs)
    a100 = [
        n
        for n, d in zip(names, (d for sl in pairs for d in sl["spec"]["devices"]), strict=True)
        if "A100" in str(d["attributes"]["productName"])
    ]
    # One GPU of each pair taken: two free, in two NVLink domains.
    claims = [claim("one", 1, ("p", [a100[0]])), claim("two", 1, ("p", [a100[2]]))]
    sel = f'device.attributes["{D}"].productName.contains("A100")'
    wide = claim("pair", 2)
    wide["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": sel}}]
    claims.append(wide)
    classes = {c["metadata"]["name"]: c for c in CLASSES}
    reqs, _ = pending_requests([pending_pod("pair", "pair")], claims, classes)
    r = fleet(build_world(pairs, CLASSES, claims, nodes=[node("p")]), reqs)
    reasons = {(s.product, s.reason, s.gpus) for s in r.stranded}
    products = {s.product for s in r.stranded}
    assert any(reason == "fragmented-nvlink" and n == 2 for _, reason, n in reasons), reasons
    assert any(reason == "wrong-product" and n == 2 and "L4" in p for p, reason, n in reasons), (
        reasons
    )
    assert len(products) == 2
    # Without the constraint, the two free A100s serve the claim: only the L4s are left.
    wide["spec"]["devices"].pop("constraints")
    reqs, _ = pending_requests([pending_pod("pair", "pair")], claims, classes)
    r = fleet(build_world(pairs, CLASSES, claims, nodes=[node("p")]), reqs)
    assert [s.reason for s in r.stranded] == ["wrong-product"]
    # No Pending claim: idle is not stranded.
    assert fleet(build_world(pairs, CLASSES, claims, nodes=[node("p")]), []).stranded == []


def test_dynamic_mig_counts_partitions_and_a_carved_gpu_is_not_free() -> None:
    s = slices("m", "2xH100-80GB", MigMode.DYNAMIC)
    devices = [d for sl in s for d in sl["spec"]["devices"]]
    part = next(d["name"] for d in devices if d["attributes"]["type"]["string"] == "mig")
    claims = [claim("slice", 1, ("m", [part]), nvlinked=False)]
    r = fleet(build_world(s, CLASSES, claims, nodes=[node("m")]), [])
    (t,) = r.totals.values()
    assert (t.published, t.carved, t.free) == (2, 1, 1)
    (view,) = r.nodes
    profile = next(p for p, (used, _) in view.mig.items() if used)
    assert view.mig[profile][0] == 1 and f"MIG {profile}" in view.shapes()
    # A whole-GPU claim for two: one GPU is carved, so the layout strands it.
    claims.append(claim("two", 2, nvlinked=False))
    reqs, _ = pending_requests(
        [pending_pod("two", "two")], claims, {c["metadata"]["name"]: c for c in CLASSES}
    )
    r = fleet(build_world(s, CLASSES, claims, nodes=[node("m")]), reqs)
    assert {s.reason for s in r.stranded} == {"mig-layout", "too-few-free"}


def test_a_pending_pod_asking_for_the_integer_is_judged_as_its_claim_would_be() -> None:
    """`nvidia.com/gpu: 4` with the chart's extended-resource class: before the scheduler
    has made the pod's claim, fleet weighs the claim it would make (the class's devices,
    count 4, no NVLink constraint) against three nodes with 2 free each."""
    all_slices, claims, nodes = [], [], []
    for i in range(3):
        n = f"n{i}"
        s = slices(n, "8xH100-80GB")
        all_slices += s
        nodes.append(node(n))
        claims.append(claim(f"{n}-a", 6, (n, gpu_names(s)[0:6])))
    ext = {
        "metadata": {"name": "extended." + D},
        "spec": {**CLASSES[0]["spec"], "extendedResourceName": "nvidia.com/gpu"},
    }
    classes = {c["metadata"]["name"]: c for c in [*CLASSES, ext]}
    pod = {
        "metadata": {"name": "wide", "namespace": "team"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Pending"},
    }
    reqs, bad = pending_requests([pod], claims, classes)
    assert bad == []
    assert [(r.name, r.count, r.same_nvlink) for r in reqs] == [("container-0-request-0", 4, False)]
    r = fleet(build_world(all_slices, list(classes.values()), claims, nodes=nodes), reqs)
    assert r.stranded_gpus == 6
    assert {s.reason for s in r.stranded} == {"too-few-free"}


def test_shared_gpus_show_their_shares_and_the_memory_no_pending_share_fits_in() -> None:
    """Two H100s published by memory (consumable capacity): three 20Gi shares on one, a
    70Gi share on the other. 29.2Gi is left across them, and a Pending 30Gi share fits
    on neither: fleet says so, as the scheduler's capacity rules do."""
    from dradriver.inventory.node_devices import MigMode
    from dradriver.nvml.library import open_nvml
    from dradriver.slices.build import build
    from dradriver.slices.consumable import parse_mode
    from dradriver.slices.publish import render

    found = open_nvml("fake:2xH100-80GB", node="s", state_dir=None).discover()
    sl = render(
        D, "s", build(found.inventory, MigMode.NONE, consumable=parse_mode("memory")).slices
    )
    g0, g1 = gpu_names(sl)

    def share(name: str, asks: str, on: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": D,
                                "capacity": {"requests": {"memory": asks}},
                            },
                        }
                    ]
                }
            },
        }
        if on:
            result = {
                "request": "gpu",
                "driver": D,
                "pool": "s",
                "device": on,
                "shareID": f"{len(name):08d}-0000-4000-8000-{name.encode().hex():0>12}"[-36:],
                "consumedCapacity": {"memory": asks, "compute": "0"},
            }
            c["status"] = {"allocation": {"devices": {"results": [result]}}}
        return c

    claims = [share(f"s{i}", "20Gi", g0) for i in range(3)] + [share("big", "70Gi", g1)]
    claims.append(share("wide", "30Gi"))
    classes = {c["metadata"]["name"]: c for c in CLASSES}
    reqs, _ = pending_requests([pending_pod("wide", "wide")], claims, classes)
    assert [dict(r.capacity) for r in reqs] == [{"memory": 30 * 2**30}]
    r = fleet(build_world(sl, CLASSES, claims, nodes=[node("s")]), reqs)
    (view,) = r.nodes
    (c,) = view.products.values()
    assert (c.published, c.shared, c.allocated, c.free) == (2, 2, 0, 0)
    assert [(g.device, g.claims, g.memory_held) for g in view.shared] == [
        (g0, 3, 60 * 2**30),
        (g1, 1, 70 * 2**30),
    ]
    assert view.largest_share is not None and view.largest_share < 30 * 2**30
    assert r.stranded_gpus == 0
    assert {s.reason for s in r.stranded} == {"memory-left"}
    assert r.stranded_memory == sum(g.memory - g.memory_held for g in view.shared)
    assert "claim team/wide asks 30Gi" in r.stranded[0].detail
    out = as_dict(r)
    assert out["nodes"][0]["shared"][0]["shares"] == 3
    # One share fewer on the first: 39.6Gi left there, and the 30Gi share fits; only the
    # second's 9.6Gi is of no use to it.
    r = fleet(build_world(sl, CLASSES, claims[1:], nodes=[node("s")]), reqs)
    (left,) = r.stranded
    assert left.detail.startswith(f"9.6Gi left on {g1} beside 1 share")
    assert "a share of 39.6Gi" in r.nodes[0].shapes()


def test_claims_held_only_by_finished_pods_are_named() -> None:
    """A claim reserved for pods that have all finished holds its GPUs for nothing; the
    scheduler's extended-resource claim is said to be one (kubernetes#134311)."""

    def held(name: str, uids: list[str], extended: bool = False) -> dict[str, Any]:
        c = claim(name, 1, ("n1", ["gpu-a"]))
        c["status"]["reservedFor"] = [{"resource": "pods", "name": u, "uid": u} for u in uids]
        if extended:
            c["metadata"]["annotations"] = {
                "resource.kubernetes.io/extended-resource-claim": "true"
            }
        return c

    def pod(uid: str, phase: str) -> dict[str, Any]:
        return {
            "metadata": {"name": uid, "namespace": "team", "uid": uid},
            "status": {"phase": phase},
        }

    claims = [
        held("done", ["p1"], extended=True),
        held("half", ["p1", "p2"]),  # p2 still runs: in use
        held("failed", ["p3"]),
        claim("pending", 1),  # not allocated
    ]
    finished = [pod("p1", "Succeeded"), pod("p3", "Failed"), pod("p4", "Unknown")]
    got = held_by_finished(claims, finished)
    assert [(h.claim, h.pods, h.node, h.devices, h.extended) for h in got] == [
        ("team/done", ("team/p1",), "n1", 1, True),
        ("team/failed", ("team/p3",), "n1", 1, False),
    ]
