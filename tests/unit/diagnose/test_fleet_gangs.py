"""`dradriver fleet` counts the GPUs a gang placed in part holds as stranded: allocated to
its placed ranks, idle until the rest are placed (plain values: slices the driver builds
from fake GPUs, pods and Jobs as the API server returns them)."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.fleet import fleet, partial_gangs
from dradriver.diagnose.fleet_claims import pending_requests
from dradriver.diagnose.gang import gangs
from dradriver.diagnose.world import build_world
from tests.support.explain import CLASSES, D, node, slices

JOB = {
    "metadata": {"name": "train", "namespace": "team"},
    "spec": {"completionMode": "Indexed", "parallelism": 4, "completions": 4},
}


def claim(name: str, pool: str | None = None, devices: list[str] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": D, "count": 8}}]
            }
        },
    }
    if pool is not None:
        results = [
            {"request": "gpus", "driver": D, "pool": pool, "device": d} for d in devices or []
        ]
        c["status"] = {"allocation": {"devices": {"results": results}}}
    return c


def rank(i: int, node_name: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"train-{i}",
            "namespace": "team",
            "ownerReferences": [{"kind": "Job", "name": "train", "controller": True}],
        },
        "spec": {
            "resourceClaims": [{"name": "gpus", "resourceClaimName": f"train-{i}-gpus"}],
            **({"nodeName": node_name} if node_name else {}),
        },
        "status": {
            "phase": "Running" if node_name else "Pending",
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"train-{i}-gpus"}],
        },
    }


def three_of_four_placed() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    all_slices, claims, nodes = [], [], []
    for i in range(3):
        n = f"n{i}"
        s = slices(n, "8xH100-80GB")
        all_slices += s
        nodes.append(node(n))
        claims.append(
            claim(f"train-{i}-gpus", n, [d["name"] for sl in s for d in sl["spec"]["devices"]])
        )
    claims.append(claim("train-3-gpus"))
    pods = [rank(0, "n0"), rank(1, "n1"), rank(2, "n2"), rank(3)]
    return pods, claims, build_world(all_slices, CLASSES, claims, nodes=nodes)


def test_the_gpus_of_a_job_placed_three_of_four_are_stranded_with_their_reason() -> None:
    pods, claims, w = three_of_four_placed()
    (g,) = gangs(pods, pod_groups=[], jobs=[JOB])
    assert (g.what(), g.placed, g.whole) == (
        "Job team/train",
        ("train-0", "train-1", "train-2"),
        False,
    )
    held = partial_gangs(w, [g])
    assert [(s.node, s.gpus, s.reason) for s in held] == [
        ("n0", 8, "partial-gang"),
        ("n1", 8, "partial-gang"),
        ("n2", 8, "partial-gang"),
    ]
    assert held[0].detail == ("held by Job team/train, 3 of 4 pods placed: they wait for the rest")
    reqs, _ = pending_requests([pods[3]], claims, {c["metadata"]["name"]: c for c in CLASSES})
    report = fleet(w, reqs, price=2.0)
    report.stranded += held
    assert (report.stranded_gpus, report.cost_per_hour()) == (24, 48.0)


def test_a_gang_placed_whole_or_not_at_all_holds_nothing_idle() -> None:
    _, _, w = three_of_four_placed()
    whole = [rank(0, "n0"), rank(1, "n1"), rank(2, "n2"), rank(3, "n2")]
    (g,) = gangs(whole, pod_groups=[], jobs=[JOB])
    assert g.whole and partial_gangs(w, [g]) == []
    (none_placed,) = gangs([rank(i) for i in range(4)], pod_groups=[], jobs=[JOB])
    assert partial_gangs(w, [none_placed]) == []


def test_a_job_of_independent_workers_is_no_gang() -> None:
    pods, _, _ = three_of_four_placed()
    workers = {**JOB, "spec": {"parallelism": 4, "completions": 40}}
    assert gangs(pods, pod_groups=[], jobs=[workers]) == []


def test_a_pod_group_is_the_gang_of_the_pods_that_name_it() -> None:
    pods, _, w = three_of_four_placed()
    for p in pods:
        p["spec"]["schedulingGroup"] = {"podGroupName": "ring"}
    group = {
        "metadata": {"name": "ring", "namespace": "team"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
    }
    (g,) = gangs(pods, pod_groups=[group], jobs=[JOB])
    assert (g.what(), len(g.placed)) == ("PodGroup team/ring", 3)
    assert sum(s.gpus for s in partial_gangs(w, [g])) == 24
