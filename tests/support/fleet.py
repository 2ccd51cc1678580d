"""The issue's twelve-node fleet as the API server returns it (Q13, Q19): twelve nodes of
8 NVLinked H100s, two 3-GPU pods running on each (72 of 96 GPUs), and a 4-GPU pod
Pending that no node has room for: 24 GPUs stranded, two a node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.diagnose.fleet import fleet
from dradriver.diagnose.fleet_claims import pending_requests
from dradriver.diagnose.fleet_report import FleetReport
from dradriver.diagnose.world import World, build_world
from tests.support.explain import CLASSES, D, node, slices

Obj = dict[str, Any]


def claim(
    name: str, count: int, on: tuple[str, list[str]] | None = None, *, pod: str | None = None
) -> Obj:
    """A claim in namespace team for `count` GPUs; `on`: allocated those devices of that
    pool, reserved for `pod`."""
    exactly = {"deviceClassName": D, "count": count}
    c: Obj = {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }
    if on is not None:
        pool, devices = on
        results = [{"request": "gpus", "driver": D, "pool": pool, "device": d} for d in devices]
        c["status"] = {"allocation": {"devices": {"results": results}}}
        if pod:
            c["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return c


def pending_pod(name: str, claim_name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": claim_name}]},
        "status": {"phase": "Pending"},
    }


@dataclass(frozen=True)
class Fleet:
    slices: list[Obj]
    claims: list[Obj]
    nodes: list[Obj]
    pods: list[Obj]  # the Pending ones
    world: World
    report: FleetReport


def twelve(nodes: int = 12, *, price: float | None = 2.5) -> Fleet:
    all_slices: list[Obj] = []
    claims: list[Obj] = []
    made: list[Obj] = []
    for i in range(nodes):
        n = f"n{i:02d}"
        s = slices(n, "8xH100-80GB")
        names = [d["name"] for sl in s for d in sl["spec"]["devices"]]
        all_slices += s
        made.append(node(n))
        claims += [
            claim(f"{n}-a", 3, (n, names[0:3]), pod=f"{n}-train-a"),
            claim(f"{n}-b", 3, (n, names[3:6]), pod=f"{n}-train-b"),
        ]
    claims.append(claim("wide", 4))
    pods = [pending_pod("wide", "wide")]
    classes = {c["metadata"]["name"]: c for c in CLASSES}
    requests, _ = pending_requests(pods, claims, classes)
    w = build_world(all_slices, CLASSES, claims, nodes=made)
    return Fleet(all_slices, claims, made, pods, w, fleet(w, requests, price))
