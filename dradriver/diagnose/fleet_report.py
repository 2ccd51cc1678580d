"""What `dradriver fleet` reports: each node's counts per product, its MIG placements and
shared GPUs and what it can still place, the Pending requests judged, the stranded GPUs
with their reasons and the claims held by finished pods; with the report's JSON form
(`-o json`), which follows these records field by field. Its own file because the
renderings (fleet_page, fleet_picture, fleet_metrics) and the controller read the report
without the counting (fleet.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.api.quantity import human
from dradriver.diagnose.cel import Selector

SHAPES = (1, 2, 4, 8)


@dataclass
class ProductCount:
    published: int = 0
    allocated: int = 0
    carved: int = 0  # partitions of it allocated: not free as a whole GPU
    tainted: int = 0
    free: int = 0
    shared: int = 0  # holding shares of its capacity (consumable capacity): not free whole

    def add(self, other: ProductCount) -> None:
        for k in ("published", "allocated", "carved", "tainted", "free", "shared"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass(frozen=True)
class SharedGpu:
    """A GPU published for several claims at once (consumable capacity) that holds shares."""

    device: str
    product: str
    claims: int  # the shares it holds
    memory_held: Fraction
    memory: Fraction  # its whole memory capacity (0: it publishes none)


@dataclass
class NodeView:
    node: str
    products: dict[str, ProductCount] = field(default_factory=dict)
    # MIG profile -> (placements allocated, placements free now)
    mig: dict[str, tuple[int, int]] = field(default_factory=dict)
    # The most whole GPUs a claim can still get here: in one NVLink domain, and at all.
    largest_nvlinked: int = 0
    largest: int = 0
    shared: list[SharedGpu] = field(default_factory=list)
    # The most memory one more share can get on one GPU here (None: no GPU is shared).
    largest_share: Fraction | None = None

    def shapes(self) -> list[str]:
        out = [f"{n} GPU{'s' if n > 1 else ''}" for n in SHAPES if self.largest >= n]
        out += [f"{n} NVLinked" for n in SHAPES if n > 1 and self.largest_nvlinked >= n]
        out += [f"MIG {p}" for p, (_, free) in sorted(self.mig.items()) if free]
        if self.largest_share:
            out.append(f"a share of {human(self.largest_share)}")
        return out


@dataclass(frozen=True)
class Request:
    """A Pending pod's claim request for devices of ours."""

    claim: str
    name: str
    count: int
    selectors: tuple[Selector, ...]
    same_nvlink: bool  # a matchAttribute constraint on nvlinkDomain covers it
    # What it asks of each device's capacity (a share: consumable capacity); {}: whole.
    capacity: Mapping[str, Fraction] = field(default_factory=dict)


@dataclass(frozen=True)
class Stranded:
    node: str
    product: str
    gpus: int
    # wrong-product, fragmented-nvlink, too-few-free, mig-layout, memory-left (free
    # capacity no Pending claim can use), partial-gang (held by a gang placed in part)
    reason: str
    detail: str
    # For memory-left: the memory left on shared GPUs that no Pending share fits in (their
    # GPUs are in use, so `gpus` is 0 and no cost is counted).
    memory: Fraction = Fraction(0)


@dataclass(frozen=True)
class HeldByFinished:
    """An allocated claim every consumer of which has finished (Succeeded or Failed): its
    devices do nothing and no one else can have them. The resourceclaim controller
    releases a finished pod's claims at once, except, in 1.34, the claim the scheduler
    made for a pod's extended resources (kubernetes/kubernetes#134311): those stay held
    while the finished pod exists."""

    claim: str
    pods: tuple[str, ...]
    node: str
    devices: int
    extended: bool  # the scheduler's claim for `nvidia.com/gpu: N`


@dataclass
class FleetReport:
    nodes: list[NodeView]
    totals: dict[str, ProductCount]
    requests: list[Request]
    stranded: list[Stranded]
    price: float | None = None
    unreadable: list[str] = field(default_factory=list)  # claims whose selectors do not compile
    held: list[HeldByFinished] = field(default_factory=list)

    @property
    def stranded_gpus(self) -> int:
        return sum(s.gpus for s in self.stranded)

    @property
    def stranded_memory(self) -> Fraction:
        return sum((s.memory for s in self.stranded), Fraction(0))

    def cost_per_hour(self) -> float | None:
        return None if self.price is None else self.stranded_gpus * self.price

    @property
    def held_devices(self) -> int:
        return sum(h.devices for h in self.held)


def as_dict(r: FleetReport) -> dict[str, Any]:
    def counts(c: ProductCount) -> dict[str, int]:
        return {
            "published": c.published,
            "allocated": c.allocated,
            "carved": c.carved,
            "tainted": c.tainted,
            "free": c.free,
            "shared": c.shared,
        }

    return {
        "totals": {p: counts(c) for p, c in sorted(r.totals.items())},
        "nodes": [
            {
                "node": v.node,
                "products": {p: counts(c) for p, c in sorted(v.products.items())},
                "mig": {p: {"allocated": u, "free": f} for p, (u, f) in sorted(v.mig.items())},
                "largestNVLinked": v.largest_nvlinked,
                "largest": v.largest,
                "shared": [
                    {
                        "device": g.device,
                        "product": g.product,
                        "shares": g.claims,
                        "memoryHeld": human(g.memory_held),
                        "memory": human(g.memory),
                    }
                    for g in v.shared
                ],
                "largestShare": human(v.largest_share) if v.largest_share else None,
                "fits": v.shapes(),
            }
            for v in r.nodes
        ],
        "pendingRequests": [
            {"claim": q.claim, "request": q.name, "count": q.count, "sameNVLink": q.same_nvlink}
            for q in r.requests
        ],
        "stranded": [
            {
                "node": s.node,
                "product": s.product,
                "gpus": s.gpus,
                "reason": s.reason,
                "detail": s.detail,
                **({"memory": human(s.memory)} if s.memory else {}),
            }
            for s in r.stranded
        ],
        "strandedGPUs": r.stranded_gpus,
        "strandedMemory": human(r.stranded_memory),
        "heldByFinishedPods": [
            {
                "claim": h.claim,
                "pods": list(h.pods),
                "node": h.node,
                "devices": h.devices,
                "extendedResourceClaim": h.extended,
            }
            for h in r.held
        ],
        "costPerHour": r.cost_per_hour(),
        "unreadableClaims": r.unreadable,
    }
