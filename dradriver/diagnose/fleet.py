"""`dradriver fleet` (pure): what the fleet's GPUs are doing, per node and product, what
each node can still place, and the stranded capacity: free GPUs that none of the Pending
pods' claims can use where they are, each with why.

What the integer hid: twelve 8-GPU nodes each running two 3-GPU pods are 75% busy, and
a 4-GPU pod still finds no node; the 24 free GPUs are stranded, two a node ("the node
has 2 free that the claim can take, it needs 4"). The scheduler's own rules decide
what counts: a device is taken when a claim holds it, or when a partition of it is
allocated (its pool's counters are spent: dynamic MIG); a taint with NoSchedule or
NoExecute keeps it from new claims; a claim's selectors (its class's and its own, CEL)
decide which devices it may take, and a matchAttribute constraint on nvlinkDomain
keeps a request's GPUs in one NVLink domain.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dradriver.api.quantity import human
from dradriver.diagnose import extended
from dradriver.diagnose.capacity import fit, requested
from dradriver.diagnose.cel import CompileError, Selector
from dradriver.diagnose.gang import Gang
from dradriver.diagnose.world import (
    Published,
    World,
    blocked_by_counters,
    claim_names,
    remaining_counters,
)

Obj = Mapping[str, Any]
DRIVER = "gpu.dradriver.io"
NVLINK = f"{DRIVER}/nvlinkDomain"
SHAPES = (1, 2, 4, 8)


def _attr(d: Published, name: str) -> str:
    v = d.cel.attributes.get(DRIVER, {}).get(name)
    return v if isinstance(v, str) else ""


def _kind(d: Published) -> str:
    return _attr(d, "type")


def _blocking(taint: Obj) -> bool:
    return taint.get("effect") in ("NoSchedule", "NoExecute")


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


def held_by_finished(claims: Sequence[Obj], finished: Sequence[Obj]) -> list[HeldByFinished]:
    """The allocated claims of our devices reserved only for pods that have finished."""
    done = {
        p["metadata"].get("uid"): f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
        for p in finished
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    }
    out = []
    for c in claims:
        status = c.get("status") or {}
        results = [
            r
            for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            if r.get("driver") == DRIVER and not r.get("adminAccess")
        ]
        users = status.get("reservedFor") or []
        if not results or not users or not all(u.get("uid") in done for u in users):
            continue
        meta = c["metadata"]
        out.append(
            HeldByFinished(
                f"{meta.get('namespace', '')}/{meta['name']}",
                tuple(sorted(done[u["uid"]] for u in users)),
                str(results[0].get("pool", "")),
                len(results),
                (meta.get("annotations") or {}).get(extended.EXTENDED_CLAIM_ANNOTATION) == "true",
            )
        )
    return sorted(out, key=lambda h: (h.node, h.claim))


def partial_gangs(w: World, gangs: Sequence[Gang]) -> list[Stranded]:
    """The GPUs held by the placed pods of gangs not placed whole: allocated, and doing
    nothing until the rest of their gang is placed (pods placed one at a time, with no
    gang scheduler to hold them back). Per node and product; MIG devices held are told
    in the detail."""
    out = []
    for g in gangs:
        if g.whole or not g.placed:
            continue
        held: dict[tuple[str, str], list[Published]] = defaultdict(list)
        for d in w.devices:
            if d.driver == DRIVER and d.node and g.claims & set(w.holders.get(d.id, ())):
                held[(d.node, d.product() or "unknown")].append(d)
        for (node, product), devs in sorted(held.items()):
            gpus = sum(1 for d in devs if _kind(d) == "gpu")
            mig = len(devs) - gpus
            out.append(
                Stranded(
                    node,
                    product,
                    gpus,
                    "partial-gang",
                    f"held by {g.what()}, {len(g.placed)} of {g.size} pods placed: they wait "
                    "for the rest"
                    + (f" (and {mig} MIG device{'s' if mig > 1 else ''})" if mig else ""),
                )
            )
    return out


def pending_requests(
    pods: Sequence[Obj], claims: Sequence[Obj], classes: Mapping[str, Obj]
) -> tuple[list[Request], list[str]]:
    """The requests of the unallocated claims of pods not bound yet, for our classes."""
    by_name = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims}
    out: list[Request] = []
    unreadable: list[str] = []
    seen: set[tuple[str, str]] = set()
    for p in pods:
        if (p.get("spec") or {}).get("nodeName"):
            continue
        ns = p["metadata"].get("namespace", "")
        names = claim_names(p)
        todo = [by_name[(ns, n)] for n in names if (ns, n) in by_name and (ns, n) not in seen]
        seen.update((ns, c["metadata"]["name"]) for c in todo)
        # `nvidia.com/gpu: 2` in a container (DRAExtendedResource): the claim the
        # scheduler made for it (among the names), else the one it would make.
        if not (p.get("status") or {}).get("extendedResourceClaimStatus"):
            made_up = extended.plan(p, list(classes.values()), ()).claim
            todo += [made_up] if made_up is not None else []
        for claim in todo:
            if (claim.get("status") or {}).get("allocation"):
                continue
            try:
                out += _requests(claim, classes)
            except CompileError:
                unreadable.append(f"{ns}/{claim['metadata']['name']}")
    return out, unreadable


def _requests(claim: Obj, classes: Mapping[str, Obj]) -> list[Request]:
    devices = (claim.get("spec") or {}).get("devices") or {}
    names = [r.get("name", "") for r in devices.get("requests") or []]
    nvlinked: set[str] = set()
    for c in devices.get("constraints") or []:
        if c.get("matchAttribute") == NVLINK:
            nvlinked |= set(c.get("requests") or names)
    ref = f"{claim['metadata'].get('namespace', '')}/{claim['metadata']['name']}"
    out = []
    for r in devices.get("requests") or []:
        exactly = r.get("exactly") or {}
        cls = classes.get(exactly.get("deviceClassName", ""))
        if cls is None or exactly.get("allocationMode") == "All":
            continue
        exprs = [
            s["cel"]["expression"]
            for s in [
                *((cls.get("spec") or {}).get("selectors") or []),
                *(exactly.get("selectors") or []),
            ]
            if "cel" in s
        ]
        out.append(
            Request(
                ref,
                str(r.get("name", "")),
                int(exactly.get("count", 1)),
                tuple(Selector(e) for e in exprs),
                str(r.get("name", "")) in nvlinked,
                requested(exactly),
            )
        )
    return out


def _judge(req: Request, d: Published) -> bool:
    for sel in req.selectors:
        o = sel.evaluate(d.cel)
        if o.error or not o.matches:
            return False
    return True


def fleet(w: World, requests: Sequence[Request], price: float | None = None) -> FleetReport:
    allocated = set(w.holders) | set(w.sharers)
    left = remaining_counters(w, allocated)
    views: dict[str, NodeView] = {}
    free_gpus: dict[str, list[Published]] = defaultdict(list)
    carved: dict[str, list[Published]] = defaultdict(list)
    free_mig: dict[str, list[Published]] = defaultdict(list)
    shared: dict[str, list[Published]] = defaultdict(list)
    for d in w.devices:
        if d.driver != DRIVER or not d.node:
            continue
        view = views.setdefault(d.node, NodeView(d.node))
        kind = _kind(d)
        if kind == "gpu":
            count = view.products.setdefault(d.product() or "unknown", ProductCount())
            count.published += 1
            if d.multi and not any(_blocking(t) for t in d.taints):
                held = w.consumed.get(d.id, {})
                room = _memory(d) - held.get("memory", Fraction(0))
                if d.id not in w.holders and (view.largest_share or 0) < room:
                    view.largest_share = room
            if d.id in w.sharers:
                count.shared += 1
                shared[d.node].append(d)
                view.shared.append(
                    SharedGpu(
                        d.name,
                        d.product(),
                        len(w.sharers[d.id]),
                        w.consumed.get(d.id, {}).get("memory", Fraction(0)),
                        _memory(d),
                    )
                )
            elif d.id in allocated:
                count.allocated += 1
            elif blocked_by_counters(d, left):
                count.carved += 1
                carved[d.node].append(d)
            elif any(_blocking(t) for t in d.taints):
                count.tainted += 1
            else:
                count.free += 1
                free_gpus[d.node].append(d)
        elif kind == "mig":
            profile = _attr(d, "profile")
            used, free = view.mig.get(profile, (0, 0))
            if d.id in allocated:
                used += 1
            elif not blocked_by_counters(d, left) and not any(_blocking(t) for t in d.taints):
                free += 1
                free_mig[d.node].append(d)
            view.mig[profile] = (used, free)
    for node, view in views.items():
        idle = free_gpus[node]
        view.largest = len(idle)
        domains = Counter(_attr(d, "nvlinkDomain") for d in idle if _attr(d, "nvlinkDomain"))
        view.largest_nvlinked = max(domains.values(), default=min(len(idle), 1))
    stranded = _stranded(requests, free_gpus, carved, free_mig=free_mig) if requests else []
    stranded += _memory_left(requests, shared, w) if requests else []
    totals: dict[str, ProductCount] = {}
    for view in views.values():
        for product, c in view.products.items():
            totals.setdefault(product, ProductCount()).add(c)
    return FleetReport([views[n] for n in sorted(views)], totals, list(requests), stranded, price)


def _stranded(
    requests: Sequence[Request],
    free_gpus: Mapping[str, list[Published]],
    carved: Mapping[str, list[Published]],
    *,
    free_mig: Mapping[str, list[Published]],
) -> list[Stranded]:
    out: list[Stranded] = []
    seen: dict[tuple[int, tuple[str, str, str]], bool] = {}

    def _matches(r: Request, d: Published) -> bool:
        # Each (request, device) judged once: a node's GPUs are compared pairwise.
        key = (id(r), d.id)
        if key not in seen:
            seen[key] = _judge(r, d)
        return seen[key]

    for node in sorted(set(free_gpus) | set(carved)):
        free = free_gpus.get(node, [])
        # Why each free GPU is of no use to any Pending request here; None: one can use it.
        why: dict[str, tuple[str, str]] = {}
        for d in free:
            reasons: list[tuple[str, str]] = []
            for r in requests:
                if not _matches(r, d):
                    continue
                able = [g for g in free if _matches(r, g)]
                if r.same_nvlink:
                    dom = _attr(d, "nvlinkDomain")
                    in_domain = [g for g in able if dom and _attr(g, "nvlinkDomain") == dom]
                    if len(in_domain) >= r.count:
                        reasons = []
                        break
                    if len(able) >= r.count:
                        reasons.append(
                            (
                                "fragmented-nvlink",
                                f"{len(in_domain)} free in its NVLink domain; claim {r.claim} "
                                f"needs {r.count} in one",
                            )
                        )
                        continue
                elif len(able) >= r.count:
                    reasons = []
                    break
                reasons.append(
                    (
                        "too-few-free",
                        f"the node has {len(able)} free that claim {r.claim} can take; it "
                        f"needs {r.count}",
                    )
                )
            else:
                if not reasons:
                    reasons.append(
                        ("wrong-product", f"no Pending claim selects a {d.product() or 'GPU'}")
                    )
                why[d.name] = reasons[0]
        groups: dict[tuple[str, str, str], int] = Counter(
            (d.product(), *why[d.name]) for d in free if d.name in why
        )
        # A GPU with a partition in use is no whole GPU, and its free partitions serve
        # no Pending MIG request here: the layout strands it for a whole-GPU claim.
        for d in carved.get(node, []):
            if not any(_matches(r, d) for r in requests):
                continue
            parts = [
                m for m in free_mig.get(node, []) if _attr(m, "parentUUID") == _attr(d, "uuid")
            ]
            if any(_matches(r, m) for r in requests for m in parts):
                continue
            key = (
                d.product(),
                "mig-layout",
                "a MIG partition of it is in use; a Pending claim wants it whole",
            )
            groups[key] = groups.get(key, 0) + 1
        for (product, reason, detail), n in sorted(groups.items()):
            out.append(Stranded(node, product, n, reason, detail))
    return out


def _shares(n: int) -> str:
    return f"{n} share{'s' if n != 1 else ''}"


def _memory(d: Published) -> Fraction:
    cap = d.caps.get("memory")
    return cap.value if cap is not None else Fraction(0)


def _memory_left(
    requests: Sequence[Request], shared: Mapping[str, list[Published]], w: World
) -> list[Stranded]:
    """Memory left on GPUs that hold shares, where Pending shares would go (their selectors
    take the GPU) but none fits in what is left: the consumable-capacity form of
    fragmentation. Judged by the scheduler's capacity rules (diagnose/capacity.py)."""
    out: list[Stranded] = []
    for node in sorted(shared):
        for d in shared[node]:
            if any(_blocking(t) for t in d.taints):
                continue
            held = w.consumed.get(d.id, {})
            left = _memory(d) - held.get("memory", Fraction(0))
            wanting = [r for r in requests if r.capacity and _judge(r, d)]
            if left <= 0 or not wanting:
                continue
            if any(fit(d.caps, d.multi, r.capacity, held=held).ok for r in wanting):
                continue
            r = min(wanting, key=lambda q: q.capacity.get("memory", Fraction(0)))
            asked = r.capacity.get("memory")
            out.append(
                Stranded(
                    node,
                    d.product(),
                    0,
                    "memory-left",
                    f"{human(left)} left on {d.name} beside {_shares(len(w.sharers[d.id]))}; "
                    f"claim {r.claim} asks "
                    + (f"{human(asked)}" if asked is not None else "more than is left"),
                    left,
                )
            )
    return out


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


def class_name(product: str) -> str:
    """A DNS label for a product's class: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    words = product.lower().removeprefix("nvidia").strip()
    label = "".join(c if c.isalnum() else "-" for c in words)
    while "--" in label:
        label = label.replace("--", "-")
    return label.strip("-")[:63].strip("-") or "gpu"


def quota_classes(w: World) -> dict[str, list[dict[str, str]]]:
    """The chart's quotaClasses values for what the fleet publishes: a class per product
    of whole GPUs and per MIG profile (of one product each where two products share a
    profile name, so that a quota never counts an A100's 1g.10gb as an H100's)."""
    products: set[str] = set()
    profiles: dict[str, set[str]] = defaultdict(set)
    for d in w.devices:
        if d.driver != DRIVER:
            continue
        if _kind(d) == "gpu" and d.product():
            products.add(d.product())
        elif _kind(d) == "mig" and _attr(d, "profile"):
            profiles[_attr(d, "profile")].add(d.product())
    migs: list[dict[str, str]] = []
    for profile, owners in sorted(profiles.items()):
        short = profile.replace(".", "").replace("+", "-")
        if len(owners) == 1:
            migs.append({"profile": profile})
            continue
        for p in sorted(owners):
            migs.append(
                {
                    "name": f"{short}-{class_name(p)}"[:63].strip("-"),
                    "profile": profile,
                    "productName": p,
                }
            )
    return {
        "products": [{"name": class_name(p), "productName": p} for p in sorted(products)],
        "migProfiles": migs,
    }


def quota_class_names(
    values: Mapping[str, list[dict[str, str]]],
    gpu_class: str = "gpu.dradriver.io",
    mig_class: str = "mig.dradriver.io",
) -> list[str]:
    """The DeviceClasses the chart makes of quotaClasses values (templates/
    deviceclasses.yaml): <name>.<gpu class> per product; <name, else the profile without
    dots, '+' as '-'>.<mig class> per MIG profile."""
    out = [f"{p['name']}.{gpu_class}" for p in values.get("products") or []]
    for m in values.get("migProfiles") or []:
        name = m.get("name") or m["profile"].replace(".", "").replace("+", "-")
        out.append(f"{name}.{mig_class}")
    return out


def kueue_mappings(classes: Sequence[str]) -> dict[str, Any]:
    """Kueue's `resources` configuration (its DynamicResourceAllocation gate): each class
    charged as a quota resource of its own name, what a ClusterQueue then lists in its
    coveredResources."""
    return {
        "resources": {
            "deviceClassMappings": [{"name": c, "deviceClassNames": [c]} for c in classes]
        }
    }
