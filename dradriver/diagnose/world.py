"""What the scheduler sees, as typed records: the devices of the newest generation of
each pool, the node they are on, what they consume of their pool's counters, and which
claim holds each one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.api import quantity
from dradriver.diagnose.capacity import Capacity, capacities
from dradriver.diagnose.cel import Device, device_from_api

Obj = Mapping[str, Any]
DeviceId = tuple[str, str, str]  # driver, pool, device
Counters = Mapping[str, Mapping[str, Fraction]]  # counter set -> counter -> amount


@dataclass(frozen=True)
class Published:
    driver: str
    pool: str
    name: str
    node: str  # "" when the slice is not for one node (allNodes or a node selector)
    cel: Device
    consumes: Counters
    # Device taints (DRADeviceTaints): an unhealthy GPU's `<driver>/unhealthy`, an admin's.
    taints: tuple[Obj, ...] = field(default=(), compare=False)
    # Its capacities with their requestPolicy, and whether several claims may hold
    # shares of it (consumable capacity).
    caps: Mapping[str, Capacity] = field(default_factory=dict, compare=False)
    multi: bool = False

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    def product(self) -> str:
        for attrs in self.cel.attributes.values():
            for key in ("productName", "product", "model"):
                if isinstance(attrs.get(key), str):
                    return str(attrs[key])
        return ""


@dataclass
class World:
    devices: list[Published] = field(default_factory=list)
    shared: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = field(default_factory=dict)
    holders: dict[DeviceId, list[str]] = field(default_factory=dict)  # device -> claims
    # Devices that allow multiple allocations: the claims holding shares of each, and
    # what their shares consume together (capacity name -> amount).
    sharers: dict[DeviceId, list[str]] = field(default_factory=dict)
    consumed: dict[DeviceId, dict[str, Fraction]] = field(default_factory=dict)
    classes: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    slice_count: int = 0
    gates: dict[str, bool] = field(default_factory=dict)  # the API server's, when readable


def _counters(entries: Sequence[Obj]) -> dict[str, dict[str, Fraction]]:
    out: dict[str, dict[str, Fraction]] = {}
    for e in entries:
        name = e.get("counterSet") or e.get("name") or ""
        out[name] = {
            c: quantity.parse(str(v.get("value", "0")))
            for c, v in (e.get("counters") or {}).items()
        }
    return out


def build_world(
    slices: Sequence[Obj],
    classes: Sequence[Obj],
    claims: Sequence[Obj],
    *,
    nodes: Sequence[Obj],
    gates: Mapping[str, bool] | None = None,
) -> World:
    w = World(slice_count=len(slices), gates=dict(gates or {}))
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec", {})
        key = (spec.get("driver", ""), spec.get("pool", {}).get("name", ""))
        newest[key] = max(newest.get(key, 0), int(spec.get("pool", {}).get("generation", 0)))
    for s in slices:
        spec = s.get("spec", {})
        driver, pool = spec.get("driver", ""), spec.get("pool", {}).get("name", "")
        # The scheduler reads only a pool's newest generation; older slices are leftovers.
        if int(spec.get("pool", {}).get("generation", 0)) != newest[(driver, pool)]:
            continue
        node = str(spec.get("nodeName") or "")
        w.shared.setdefault((driver, pool), {}).update(_counters(spec.get("sharedCounters", [])))
        for d in spec.get("devices", []):
            w.devices.append(
                Published(
                    driver,
                    pool,
                    d["name"],
                    node,
                    device_from_api(driver, d),
                    _counters(d.get("consumesCounters", [])),
                    tuple(d.get("taints") or ()),
                    capacities(d),
                    bool(d.get("allowMultipleAllocations")),
                )
            )
    w.classes = {c["metadata"]["name"]: c for c in classes}
    w.nodes = {n["metadata"]["name"]: n for n in nodes}
    for c in claims:
        name = f"{c['metadata'].get('namespace', '')}/{c['metadata']['name']}"
        results = (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results")
        for r in results or []:
            if r.get("adminAccess"):
                continue  # admin access never takes a device away from anyone
            dev = (r["driver"], r["pool"], r["device"])
            if r.get("shareID"):  # one share: the device stays open to more
                w.sharers.setdefault(dev, []).append(name)
                held = w.consumed.setdefault(dev, {})
                for cap, amount in (r.get("consumedCapacity") or {}).items():
                    held[cap] = held.get(cap, Fraction(0)) + quantity.parse(str(amount))
                continue
            w.holders.setdefault(dev, []).append(name)
    return w


def remaining_counters(
    w: World, allocated: set[DeviceId]
) -> dict[tuple[str, str], dict[str, dict[str, Fraction]]]:
    """Each pool's shared counters minus what its allocated devices consume."""
    left: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {
        k: {cs: dict(cv) for cs, cv in v.items()} for k, v in w.shared.items()
    }
    for d in w.devices:
        if d.id not in allocated:
            continue
        pool = left.get((d.driver, d.pool), {})
        for cs, cv in d.consumes.items():
            for c, amount in cv.items():
                pool.setdefault(cs, defaultdict(Fraction))
                pool[cs][c] = pool[cs].get(c, Fraction(0)) - amount
    return left


def blocked_by_counters(d: Published, left: Mapping[tuple[str, str], Counters]) -> bool:
    pool = left.get((d.driver, d.pool), {})
    return any(
        amount > pool.get(cs, {}).get(c, Fraction(0))
        for cs, cv in d.consumes.items()
        for c, amount in cv.items()
    )


def claim_names(pod: Obj) -> list[str]:
    """The names of the claims a pod uses, in its namespace: each named in its spec, or
    made for it from a template (its status says which), and the claim the scheduler
    made for its extended resources (DRAExtendedResource), where there is one."""
    status = pod.get("status") or {}
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    names = [
        rc.get("resourceClaimName") or generated.get(rc.get("name"))
        for rc in (pod.get("spec") or {}).get("resourceClaims") or []
    ]
    names.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
    return [n for n in names if isinstance(n, str) and n]
