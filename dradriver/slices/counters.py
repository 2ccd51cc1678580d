"""Shared counters that make the scheduler respect MIG geometry (dynamic MIG mode).

Every partition (profile x placement) and the whole GPU consume counters of the GPU's
counter set; the scheduler allocates a set of devices only if no counter is exceeded.
We want counters that admit *exactly* the combinations NVML would create, and as few
of them as possible: each counter costs slice size and scheduler work.

Candidate counters, each with capacity 1 unless said otherwise:
- one per memory slice (the placement axis): two partitions overlap iff they share one;
- one for the media extensions (at most one "+me" instance per GPU);
- compute slices with capacity 7.
Then we drop what is implied: a unit counter whose users are a subset of another
kept counter's users adds no constraint (on A100/H100 geometry, memory slice 7 is only
ever used together with slice 6), and the compute counter is dropped when no set of
partitions admitted by the rest exceeds it. The exhaustive tests compare the result with
NVML's rules over every combination of placements.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dradriver.inventory.model import MigProfile
from dradriver.inventory.node_devices import Partition, partitions

__all__ = ["COMPUTE", "MEDIA_EXTENSIONS", "CounterDesign", "Partition", "design", "partitions"]

COMPUTE_CAPACITY = 7
MEDIA_EXTENSIONS = "media-extensions"
COMPUTE = "compute-slices"


def memory_counter(i: int) -> str:
    return f"memory-slice-{i}"


def demand(p: Partition) -> dict[str, int]:
    """What a partition would consume of every candidate counter."""
    d = {memory_counter(i): 1 for i in p.profile.memory_range(p.start)}
    if p.profile.media_extensions:
        d[MEDIA_EXTENSIONS] = 1
    d[COMPUTE] = p.profile.compute_slices
    return d


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


@lru_cache(maxsize=64)
def design(profiles: tuple[MigProfile, ...]) -> CounterDesign:
    parts = partitions(profiles)
    if not parts:
        return CounterDesign({}, {})
    demands = {p: demand(p) for p in parts}
    unit = sorted(
        {c for d in demands.values() for c in d if c != COMPUTE},
        key=lambda c: (
            c == MEDIA_EXTENSIONS,
            int(c.rsplit("-", 1)[1]) if c.startswith("memory-slice-") else 0,
        ),
    )
    users = {c: frozenset(p for p in parts if c in demands[p]) for c in unit}
    kept: list[str] = []
    for c in unit:
        # Dominated by a counter we keep (or by a later one with strictly more users).
        if any(users[c] <= users[k] for k in kept) or any(
            users[c] < users[o] for o in unit if o != c and o not in kept
        ):
            continue
        kept.append(c)
    capacities = {c: 1 for c in kept}
    consumption = {p: {c: v for c, v in demands[p].items() if c in capacities} for p in parts}
    # Is the compute limit implied by the memory geometry? Check every admitted set.
    if any(
        sum(p.profile.compute_slices for p in s) > COMPUTE_CAPACITY
        for s in admitted_sets(parts, capacities, consumption)
    ):
        capacities[COMPUTE] = COMPUTE_CAPACITY
        consumption = {p: {c: v for c, v in demands[p].items() if c in capacities} for p in parts}
    return CounterDesign(capacities, consumption)
