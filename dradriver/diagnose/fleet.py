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

Here the count and the stranded GPUs; the report's records are in fleet_report.py, the
Pending requests and finished pods' claims read in fleet_claims.py, the quota classes in
fleet_quota.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dradriver.api.quantity import human
from dradriver.diagnose.capacity import fit
from dradriver.diagnose.fleet_report import (
    FleetReport,
    NodeView,
    ProductCount,
    Request,
    SharedGpu,
    Stranded,
)
from dradriver.diagnose.gang import Gang
from dradriver.diagnose.world import (
    Published,
    World,
    blocked_by_counters,
    remaining_counters,
)

Obj = Mapping[str, Any]
DRIVER = "gpu.dradriver.io"


# Public: fleet_quota.py reads devices as the count does.
def attr(d: Published, name: str) -> str:
    v = d.cel.attributes.get(DRIVER, {}).get(name)
    return v if isinstance(v, str) else ""


def kind_of(d: Published) -> str:
    return attr(d, "type")


def _blocking(taint: Obj) -> bool:
    return taint.get("effect") in ("NoSchedule", "NoExecute")


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
            gpus = sum(1 for d in devs if kind_of(d) == "gpu")
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
        kind = kind_of(d)
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
            profile = attr(d, "profile")
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
        domains = Counter(attr(d, "nvlinkDomain") for d in idle if attr(d, "nvlinkDomain"))
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
                    dom = attr(d, "nvlinkDomain")
                    in_domain = [g for g in able if dom and attr(g, "nvlinkDomain") == dom]
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
            parts = [m for m in free_mig.get(node, []) if attr(m, "parentUUID") == attr(d, "uuid")]
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
