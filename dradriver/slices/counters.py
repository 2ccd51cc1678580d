"""Shared counters that make the scheduler respect MIG geometry (dynamic MIG mode).

Every partition (profile x placement) and the whole GPU consume counters of the GPU's
counter set; the scheduler allocates a set of devices only if no counter is exceeded.
We want counters that admit *exactly* the combinations NVML would create, and as few
of them as possible: each counter costs slice size and scheduler work.

The candidates are every limit NVML applies (dradriver.inventory.mig_geometry): one
counter per memory slice (two partitions overlap iff they share one), the compute slices,
each kind of media engine (NVDEC, NVENC, JPEG, OFA: the engine rule is what allows one
`+me` instance per GPU and keeps a plain 1g off an RTX PRO 6000 holding `+me.all`), and
each profile's instance count. Then we drop what is implied: a memory counter whose users
are a subset of another kept memory counter's users adds no constraint (on A100/H100,
slice 7 is only ever used together with slice 6; on RTX PRO's 12-unit grid three units
always go together), and any other counter is dropped when no set of partitions the
remaining counters admit exceeds it (checked by enumerating those sets). On A100/H100
what remains is 7 memory counters and the OFA. The exhaustive tests compare the result with
NVML's rules over every combination of placements of every product.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dradriver.inventory import mig_geometry
from dradriver.inventory.mig_geometry import COMPUTE
from dradriver.inventory.model import MigProfile
from dradriver.inventory.node_devices import Partition, partitions

__all__ = ["COMPUTE", "CounterDesign", "Partition", "design", "partitions"]


def demand(p: Partition) -> dict[str, int]:
    """What a partition would consume of every candidate counter."""
    return mig_geometry.demand(p.profile, p.start)


@dataclass(frozen=True)
class CounterDesign:
    capacities: dict[str, int]  # counter -> capacity, in a stable order
    consumption: dict[Partition, dict[str, int]]  # partition -> counters it consumes

    def whole_gpu(self) -> dict[str, int]:
        """The whole GPU takes every counter entirely: nothing else fits beside it."""
        return dict(self.capacities)


def fits(used: dict[str, int], demand: dict[str, int], capacities: dict[str, int]) -> bool:
    return all(used.get(c, 0) + v <= capacities[c] for c, v in demand.items() if c in capacities)


def admitted_sets(
    parts: Sequence[Partition],
    capacities: dict[str, int],
    consumption: dict[Partition, dict[str, int]],
) -> Iterator[tuple[Partition, ...]]:
    """Every non-empty set of partitions the counters admit (depth-first, each set once)."""

    def walk(
        i: int, chosen: list[Partition], used: dict[str, int]
    ) -> Iterator[tuple[Partition, ...]]:
        for j in range(i, len(parts)):
            demand = consumption[parts[j]]
            if not fits(used, demand, capacities):
                continue
            for c, v in demand.items():
                used[c] = used.get(c, 0) + v
            chosen.append(parts[j])
            yield tuple(chosen)
            yield from walk(j + 1, chosen, used)
            chosen.pop()
            for c, v in demand.items():
                used[c] -= v

    yield from walk(0, [], {})


def _restrict(
    demands: dict[Partition, dict[str, int]], counters: Iterable[str]
) -> dict[Partition, dict[str, int]]:
    keep = set(counters)
    return {p: {c: v for c, v in d.items() if c in keep} for p, d in demands.items()}


def _exceeds(
    parts: Sequence[Partition],
    counter: str,
    capacities: dict[str, int],
    *,
    demands: dict[Partition, dict[str, int]],
    limit: int,
) -> bool:
    """Whether some set of partitions that `capacities` admit takes more than `limit` of
    `counter`."""
    consumption = _restrict(demands, capacities)
    return any(
        sum(demands[p].get(counter, 0) for p in s) > limit
        for s in admitted_sets(parts, capacities, consumption)
    )


@lru_cache(maxsize=64)
def design(profiles: tuple[MigProfile, ...]) -> CounterDesign:
    parts = partitions(profiles)
    if not parts:
        return CounterDesign({}, {})
    limits = mig_geometry.geometry(profiles).capacities(profiles)
    demands = {p: demand(p) for p in parts}
    memory = sorted(
        {c for d in demands.values() for c in d if c.startswith("memory-slice-")},
        key=lambda c: int(c.rsplit("-", 1)[1]),
    )
    users = {c: frozenset(p for p in parts if c in demands[p]) for c in memory}
    kept: list[str] = []
    for c in memory:
        # Dominated by a counter we keep (or by a later one with strictly more users).
        if any(users[c] <= users[k] for k in kept) or any(
            users[c] < users[o] for o in memory if o != c and o not in kept
        ):
            continue
        kept.append(c)
    # The other limits, the most specific first, so that a limit implied by a broader
    # one (a +me profile's single instance by the one OFA) is the one dropped.
    others = [c for c in limits if not c.startswith("memory-slice-")]
    # Among engines where two always bind together, the one tried first is dropped: keep
    # the OFA (the media-extension lock on every product) and the decoders, the names an
    # operator reads most easily.
    order = ["encoders", "jpeg-engines", "decoders", "ofa-engines"]
    others.sort(
        key=lambda c: (
            not c.startswith("profile-"),
            c != COMPUTE,
            order.index(c) if c in order else 0,
        )
    )
    capacities = {c: 1 for c in kept} | {c: limits[c] for c in others}
    for c in others:
        trial = {k: v for k, v in capacities.items() if k != c}
        if not _exceeds(parts, c, trial, demands=demands, limit=limits[c]):
            capacities = trial
    return CounterDesign(capacities, _restrict(demands, capacities))
