"""The fleet as Prometheus samples (pure): what `dradriver fleet` prints, for the controller
to export over time (issue Q19). One source of truth: the numbers come from
diagnose/fleet.py's report, never from a second count.

Labels are the product, the node group (a Node label the controller is told, by default
the instance type), the state or reason, the MIG profile and the shape: never a node, a
pod or a claim. So the series a fleet costs are bounded by its products, groups and
profiles, not its size: products x groups x (5 states + 6 stranded reasons + 1 memory +
1 hours counter) + profiles x groups x 2 + shapes x groups + groups + the pending
claims' reasons (explain's layers, a fixed set), whatever the number of nodes or pods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.diagnose.explain import explain_claim
from dradriver.diagnose.explain_report import ClaimRef
from dradriver.diagnose.fleet_report import SHAPES, FleetReport
from dradriver.diagnose.world import World, claim_names

Obj = Mapping[str, Any]
STATES = ("allocated", "carved", "shared", "tainted", "free")
# What a pending claim waits for when explain finds nothing against it: room is there,
# the scheduler has not placed it yet (or places it elsewhere for a reason of the pod's).
FITS = "fits"
NO_GROUP = "none"
# explain evaluates a claim's CEL against every device of the fleet (some 0.2 s a claim at
# 500 nodes): past this many Pending claims an update counts the rest as `unexamined`
# rather than grow without bound when a queue fills up.
MAX_EXPLAINED = 50
UNEXAMINED = "unexamined"


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]


GPUS = Family(
    "dradriver_fleet_gpus",
    "gauge",
    "Whole GPUs published, by state: allocated, carved (a MIG partition of it allocated), "
    "shared (holding shares of its capacity), tainted (NoSchedule/NoExecute), free",
    ("product", "node_group", "state"),
)
STRANDED = Family(
    "dradriver_fleet_stranded_gpus",
    "gauge",
    "Free GPUs that no Pending claim can use where they are, by reason (as dradriver fleet)",
    ("product", "node_group", "reason"),
)
STRANDED_MEMORY = Family(
    "dradriver_fleet_stranded_memory_bytes",
    "gauge",
    "Memory left on shared GPUs that no Pending share fits in",
    ("product", "node_group"),
)
STRANDED_HOURS = Family(
    "dradriver_fleet_stranded_gpu_hours_total",
    "counter",
    "GPU-hours spent stranded since the controller started",
    ("product", "node_group"),
)
MIG = Family(
    "dradriver_fleet_mig_devices",
    "gauge",
    "MIG partitions (dynamic MIG placements or static MIG devices) by profile: allocated, "
    "or free to allocate now",
    ("profile", "node_group", "state"),
)
FITTING = Family(
    "dradriver_fleet_nodes_fitting",
    "gauge",
    "Nodes where a pod of this shape still fits now: N GPUs, N NVLinked GPUs, MIG <profile>",
    ("shape", "node_group"),
)
NODES = Family("dradriver_fleet_nodes", "gauge", "Nodes publishing GPUs", ("node_group",))
PENDING = Family(
    "dradriver_fleet_pending_claims",
    "gauge",
    "Unallocated claims of Pending pods, by what `dradriver explain` finds against them (its "
    "layer: deviceclass, selector, capacity, taint, ...; fits: room exists)",
    ("reason",),
)
FAMILIES = (GPUS, STRANDED, STRANDED_MEMORY, STRANDED_HOURS, MIG, FITTING, NODES, PENDING)


@dataclass(frozen=True)
class Sample:
    family: Family
    labels: tuple[str, ...]  # in the family's label order
    value: float


def _shapes() -> list[str]:
    whole = [f"{n} GPU{'s' if n > 1 else ''}" for n in SHAPES]
    return whole + [f"{n} NVLinked" for n in SHAPES if n > 1]


def gauges(report: FleetReport, groups: Mapping[str, str]) -> list[Sample]:
    """Every gauge of the report; `groups` maps a node to its group (missing: none).
    Counts that are zero are still samples where their product, profile or shape exists:
    a panel's sum must not lose a series when its last GPU is taken."""
    group = {v.node: groups.get(v.node, NO_GROUP) for v in report.nodes}
    gpus: Counter[tuple[str, ...]] = Counter()
    mig: Counter[tuple[str, ...]] = Counter()
    fitting: Counter[tuple[str, ...]] = Counter()
    nodes: Counter[tuple[str, ...]] = Counter()
    for v in report.nodes:
        g = group[v.node]
        nodes[(g,)] += 1
        for product, c in v.products.items():
            for state in STATES:
                gpus[(product, g, state)] += getattr(c, state)
        for profile, (used, free) in v.mig.items():
            mig[(profile, g, "allocated")] += used
            mig[(profile, g, "free")] += free
        shapes = set(v.shapes())
        for shape in _shapes() + [f"MIG {p}" for p in v.mig]:
            fitting[(shape, g)] += shape in shapes
    stranded: Counter[tuple[str, ...]] = Counter()
    memory: dict[tuple[str, ...], float] = {}
    for s in report.stranded:
        g = group.get(s.node, groups.get(s.node, NO_GROUP))
        if s.gpus:
            stranded[(s.product, g, s.reason)] += s.gpus
        if s.memory:
            memory[(s.product, g)] = memory.get((s.product, g), 0.0) + float(s.memory)
    out = [Sample(GPUS, k, n) for k, n in sorted(gpus.items())]
    out += [Sample(STRANDED, k, n) for k, n in sorted(stranded.items())]
    out += [Sample(STRANDED_MEMORY, k, n) for k, n in sorted(memory.items())]
    out += [Sample(MIG, k, n) for k, n in sorted(mig.items())]
    out += [Sample(FITTING, k, n) for k, n in sorted(fitting.items())]
    out += [Sample(NODES, k, n) for k, n in sorted(nodes.items())]
    return out


def accrue(
    hours: Mapping[tuple[str, str], float],
    report: FleetReport,
    groups: Mapping[str, str],
    *,
    seconds: float,
) -> dict[tuple[str, str], float]:
    """The stranded GPU-hours counter after `seconds` more of `report`'s stranding (the
    GPUs stranded at the last update are taken as stranded since)."""
    out = dict(hours)
    for s in report.stranded:
        if s.gpus:
            key = (s.product, groups.get(s.node, NO_GROUP))
            out[key] = out.get(key, 0.0) + s.gpus * seconds / 3600
    return out


def pending_reasons(
    pods: Sequence[Obj], claims: Sequence[Obj], w: World, *, limit: int = MAX_EXPLAINED
) -> Counter[str]:
    """Per reason, the unallocated claims of pods not bound yet: the layer of the first
    finding `dradriver explain` gives against one of its requests, or `fits` when it
    finds none; past `limit` claims, `unexamined`."""
    by_name = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims}
    out: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            continue
        ns = pod["metadata"].get("namespace", "")
        for name in claim_names(pod):
            claim = by_name.get((ns, name))
            if claim is None or (ns, name) in seen or (claim.get("status") or {}).get("allocation"):
                continue
            seen.add((ns, name))
            if len(seen) > limit:
                out[UNEXAMINED] += 1
                continue
            reports = explain_claim(ClaimRef(f"{ns}/{name}", claim), w, pod)
            found = next((r.finding for r in reports if r.finding is not None), None)
            out[found.layer if found else FITS] += 1
    return out
