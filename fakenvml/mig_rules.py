"""NVML's admission rules for MIG GPU instances, as pure functions.

The single source of truth: the fake NVML library enforces these, and the tests of what
the driver advertises compare against them. An instance is (profile, placement start); its
memory slices are [start, start + profile.memory_slices).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import Enum

from fakenvml.products import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, GpuInstanceProfile

Placed = tuple[GpuInstanceProfile, int]


class Violation(Enum):
    BAD_PLACEMENT = "placement start is not one of the profile's possible placements"
    MEMORY_OVERLAP = "memory slices overlap another GPU instance"
    COMPUTE_EXHAUSTED = f"compute slices would exceed {MIG_COMPUTE_SLICES}"
    MEDIA_EXTENSIONS_TAKEN = "only one media-extension (+me) instance per GPU"
    PROFILE_LIMIT = "the profile's instance count is reached"


def memory_slices(p: Placed) -> range:
    profile, start = p
    return range(start, start + profile.memory_slices)


def conflicts(a: Placed, b: Placed) -> bool:
    """Whether two instances can never coexist on one GPU, whatever else is there."""
    ra, rb = memory_slices(a), memory_slices(b)
    overlap = ra.start < rb.stop and rb.start < ra.stop
    return overlap or (a[0].media_extensions and b[0].media_extensions)


def violation(instances: Sequence[Placed]) -> Violation | None:
    """The first rule a set of instances breaks, or None when NVML would accept it."""
    for profile, start in instances:
        if start not in profile.placement_starts or start + profile.memory_slices > (
            MIG_MEMORY_SLICES
        ):
            return Violation.BAD_PLACEMENT
    for i, a in enumerate(instances):
        for b in instances[i + 1 :]:
            if conflicts(a, b):
                if a[0].media_extensions and b[0].media_extensions:
                    return Violation.MEDIA_EXTENSIONS_TAKEN
                return Violation.MEMORY_OVERLAP
    if sum(p.compute_slices for p, _ in instances) > MIG_COMPUTE_SLICES:
        return Violation.COMPUTE_EXHAUSTED
    counts = Counter(p.id for p, _ in instances)
    for profile, _ in instances:
        if counts[profile.id] > profile.instance_count:
            return Violation.PROFILE_LIMIT
    return None


def admissible(instances: Sequence[Placed]) -> bool:
    return violation(instances) is None


def violation_adding(existing: Sequence[Placed], new: Placed) -> Violation | None:
    """Why `new` cannot join an admissible `existing` set, or None if it can."""
    return violation([*existing, new])


def free_placements(existing: Sequence[Placed], profile: GpuInstanceProfile) -> list[int]:
    """Starts at which one more instance of `profile` would be accepted now."""
    return [s for s in profile.placement_starts if violation_adding(existing, (profile, s)) is None]


def remaining_capacity(existing: Iterable[Placed], profile: GpuInstanceProfile) -> int:
    """How many more instances of `profile` fit together. A profile's placements never
    overlap one another, so adding greedily finds the maximum."""
    layout = list(existing)
    added = 0
    for start in profile.placement_starts:
        if violation_adding(layout, (profile, start)) is None:
            layout.append((profile, start))
            added += 1
    return added


def gpu_instance_id(profile: GpuInstanceProfile, start: int) -> int:
    """NVML's GPU instance ID: the node of a binary tree over the 8 memory slices that the
    placement covers (8 slices -> 0; 4 -> 1..2; 2 -> 3..6; 1 -> 7..14). This is why a
    3g instance at 0 is GI 1 and a 1g instance at 6 is GI 13 on real A100s; IDs depend on
    the placement, not on creation order."""
    size = profile.memory_slices
    first_at_level = MIG_MEMORY_SLICES // size - 1
    return first_at_level + start // size
