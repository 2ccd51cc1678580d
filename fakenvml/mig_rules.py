"""NVML's admission rules for MIG GPU instances, as pure functions.

The single source of truth: the fake NVML library enforces these, and the tests of what
the driver advertises compare against them. An instance is (profile, placement start); its
memory slices are [start, start + profile.memory_slices). What a GPU has to share comes
from its product's `MigGeometry` (placement grid, compute slices, media engines).

The engine rule is how NVML's per-profile engine counts (-lgip DEC/ENC/JPG/OFA columns)
become a limit: a GPU has the engines of its full profile (7g on A100/H100, 4g on A30 and
RTX PRO), and instances cannot together take more. It is what makes "only one +me
instance" true ([G]: "A single 1g profile can include media extensions"; GH200
`-cgi 20,20,20` refused with Insufficient Resources) and what keeps a plain 1g off an RTX
PRO 6000 that holds a `+me.all` instance ([G]: "+me.all: Allocates all available media
engines to this instance"). NVIDIA does not state the second consequence in prose: it is
derived from the engine counts, and tests/unit/nvml/test_nvidia_layouts.py lists it as
such.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import Enum

from fakenvml.products import GpuInstanceProfile, MigGeometry

Placed = tuple[GpuInstanceProfile, int]

ENGINE_KINDS = ("decoders", "encoders", "jpegs", "ofas")


class Violation(Enum):
    BAD_PLACEMENT = "placement start is not one of the profile's possible placements"
    MEMORY_OVERLAP = "memory slices overlap another GPU instance"
    COMPUTE_EXHAUSTED = "compute slices would exceed the GPU's"
    ENGINES_EXHAUSTED = "media engines (NVDEC, NVENC, JPEG, OFA) would exceed the GPU's"
    PROFILE_LIMIT = "the profile's instance count is reached"


def memory_slices(p: Placed) -> range:
    profile, start = p
    return range(start, start + profile.memory_slices)


def overlaps(a: Placed, b: Placed) -> bool:
    ra, rb = memory_slices(a), memory_slices(b)
    return ra.start < rb.stop and rb.start < ra.stop


def engines(profile: GpuInstanceProfile) -> dict[str, int]:
    return {k: getattr(profile, k) for k in ENGINE_KINDS}


def engine_totals(geometry: MigGeometry) -> dict[str, int]:
    return {k: getattr(geometry, k) for k in ENGINE_KINDS}


def conflicts(a: Placed, b: Placed) -> bool:
    """Whether two instances can never coexist on one GPU, whatever else is there (every
    rule is monotone: adding an instance never makes a refused set acceptable)."""
    return violation([a, b]) is not None


def violation(instances: Sequence[Placed]) -> Violation | None:
    """The first rule a set of instances breaks, or None when NVML would accept it."""
    if not instances:
        return None
    geometry = instances[0][0].geometry
    for profile, start in instances:
        if (
            start not in profile.placement_starts
            or start + profile.memory_slices > geometry.memory_slices
        ):
            return Violation.BAD_PLACEMENT
    for i, a in enumerate(instances):
        if any(overlaps(a, b) for b in instances[i + 1 :]):
            return Violation.MEMORY_OVERLAP
    if sum(p.compute_slices for p, _ in instances) > geometry.compute_slices:
        return Violation.COMPUTE_EXHAUSTED
    totals = engine_totals(geometry)
    for kind, total in totals.items():
        if sum(getattr(p, kind) for p, _ in instances) > total:
            return Violation.ENGINES_EXHAUSTED
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
    """How many more instances of `profile` fit together (NVML's "Free" column of -lgip).
    A profile's placements never overlap one another, so adding greedily finds the
    maximum."""
    layout = list(existing)
    added = 0
    for start in profile.placement_starts:
        if violation_adding(layout, (profile, start)) is None:
            layout.append((profile, start))
            added += 1
    return added


def gpu_instance_id(profile: GpuInstanceProfile, start: int) -> int:
    """NVML's GPU instance ID: the node of a binary tree over the placement grid that the
    placement covers (on 8 slices: the whole -> 0; 4 -> 1..2; 2 -> 3..6; 1 -> 7..14). This
    is why a 3g instance at 0 is GI 1 and a 1g instance at 6 is GI 13 on real A100s; IDs
    depend on the placement, not on creation order. A30's 4-slice and RTX PRO's 12-unit
    grids (sizes 1/2/4 and 3/6/12) follow the same tree."""
    size = profile.memory_slices
    first_at_level = profile.geometry.memory_slices // size - 1
    return first_at_level + start // size
