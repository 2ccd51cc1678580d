"""The fleet as a picture (pure): one row per node, one cell per GPU, each in the state
`dradriver fleet` counts it in, and the claims and pods that hold it; a GPU split into MIG
partitions shows the partitions in use. The page is drawn from these by
commands/fleet_html.py.

States: allocated (a claim holds it whole), shared (shares of its capacity are held),
carved (a MIG partition of it is held), tainted (a NoSchedule/NoExecute taint keeps new
claims off it), stranded (free, and no Pending claim can use it where it is: the report's
count for its node and product, given to that many of its free GPUs), free, and mig (a GPU
in static MIG mode, published only as its MIG devices).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.diagnose.fleet import DRIVER
from dradriver.diagnose.fleet_report import FleetReport
from dradriver.diagnose.world import Published, World, blocked_by_counters, remaining_counters

Obj = Mapping[str, Any]
STATES = ("allocated", "shared", "carved", "tainted", "stranded", "free", "mig")


@dataclass(frozen=True)
class Part:
    """A MIG partition of a GPU that a claim holds."""

    device: str
    profile: str
    claims: tuple[str, ...]
    pods: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    device: str  # the GPU's device name (or its UUID, for a GPU published only as MIG)
    product: str
    state: str
    claims: tuple[str, ...]  # namespace/name of each claim holding it (or a share of it)
    pods: tuple[str, ...]  # namespace/name of the pods those claims are reserved for
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class Row:
    node: str
    cells: tuple[Cell, ...]


def _attr(d: Published, name: str) -> str:
    v = d.cel.attributes.get(DRIVER, {}).get(name)
    return v if isinstance(v, str) else ""


def _index(d: Published) -> int:
    v = d.cel.attributes.get(DRIVER, {}).get("index")
    return v if isinstance(v, int) and not isinstance(v, bool) else 1 << 30


def pods_of(claims: Sequence[Obj]) -> dict[str, tuple[str, ...]]:
    """Each claim's (namespace/name) pods, from its reservedFor."""
    out: dict[str, tuple[str, ...]] = {}
    for c in claims:
        meta = c.get("metadata") or {}
        ns = meta.get("namespace", "")
        reserved = (c.get("status") or {}).get("reservedFor") or []
        out[f"{ns}/{meta.get('name', '')}"] = tuple(
            f"{ns}/{r.get('name', '')}" for r in reserved if r.get("resource") == "pods"
        )
    return out


def picture(w: World, report: FleetReport, claims: Sequence[Obj]) -> list[Row]:
    pods = pods_of(claims)
    left = remaining_counters(w, set(w.holders) | set(w.sharers))

    def held(d: Published) -> tuple[tuple[str, ...], tuple[str, ...]]:
        names = tuple(sorted(w.holders.get(d.id, []) + w.sharers.get(d.id, [])))
        return names, tuple(p for c in names for p in pods.get(c, ()))

    stranded: dict[tuple[str, str], int] = defaultdict(int)
    for s in report.stranded:
        stranded[(s.node, s.product)] += s.gpus
    gpus: dict[str, list[Published]] = defaultdict(list)
    migs: dict[str, dict[str, list[Published]]] = defaultdict(lambda: defaultdict(list))
    for d in w.devices:
        if d.driver != DRIVER or not d.node:
            continue
        kind = _attr(d, "type")
        if kind == "gpu":
            gpus[d.node].append(d)
        elif kind == "mig":
            migs[d.node][_attr(d, "parentUUID")].append(d)
    rows = []
    for node in sorted(set(gpus) | set(migs)):
        cells = []
        for d in sorted(gpus[node], key=lambda d: (_index(d), d.name)):
            claims_, pods_ = held(d)
            parts = tuple(
                Part(m.name, _attr(m, "profile"), *held(m))
                for m in sorted(migs[node].pop(_attr(d, "uuid"), []), key=lambda m: m.name)
                if m.id in w.holders
            )
            if d.id in w.sharers:
                state = "shared"
            elif d.id in w.holders:
                state = "allocated"
            elif parts or blocked_by_counters(d, left):
                state = "carved"
            elif any(t.get("effect") in ("NoSchedule", "NoExecute") for t in d.taints):
                state = "tainted"
            elif stranded[(node, d.product())] > 0:
                stranded[(node, d.product())] -= 1
                state = "stranded"
            else:
                state = "free"
            cells.append(Cell(d.name, d.product(), state, claims_, pods_, parts))
        # GPUs in static MIG mode: published only as their MIG devices.
        for parent, devices in sorted(migs[node].items()):
            parts = tuple(
                Part(m.name, _attr(m, "profile"), *held(m))
                for m in sorted(devices, key=lambda m: m.name)
                if m.id in w.holders
            )
            claims_ = tuple(c for p in parts for c in p.claims)
            pods_ = tuple(p for part in parts for p in part.pods)
            product = devices[0].product() if devices else ""
            cells.append(Cell(parent or devices[0].name, product, "mig", claims_, pods_, parts))
        rows.append(Row(node, tuple(cells)))
    return rows
