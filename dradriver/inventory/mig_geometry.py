"""What one MIG-capable GPU has for its GPU instances to share, read from the profiles NVML
reports for it, and what each GPU instance takes of it (pure).

NVML does not report a GPU's totals directly; they follow from its profiles:
- the placement grid is as wide as the furthest placement reaches (8 memory slices on
  A100/H100/B200, 4 on A30, 12 units on RTX PRO 6000, whose -lgipp prints a 12-unit grid);
- the compute slices and each kind of media engine are those of the largest profile (the
  full 7g instance owns all 5 NVDECs of an A100, the 4g.96gb all 4 NVDEC/NVENC/JPEG and the
  one OFA of an RTX PRO 6000; `+me.all` claims exactly those).
Every GPU instance takes its memory slices, its compute slices, its engines (the -lgip
DEC/ENC/JPG/OFA columns) and one of its profile's instances; NVML refuses a layout that
takes more than there is. These are the rules the shared counters encode
(dradriver.slices.counters); the fake NVML enforces the same rules from NVIDIA's tables
(fakenvml.mig_rules), and tests hold the two to the layouts NVIDIA documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dradriver.inventory.model import MigProfile

# The media engines a GPU instance may own, as counter names (DNS labels) -> the
# MigProfile field that says how many a profile takes.
ENGINES: dict[str, str] = {
    "decoders": "decoders",
    "encoders": "encoders",
    "jpeg-engines": "jpeg_engines",
    "ofa-engines": "ofa_engines",
}
COMPUTE = "compute-slices"
# Where a GPU reports no MIG profiles, a whole GPU still "occupies its memory slices".
DEFAULT_GRID = 8


def memory_counter(i: int) -> str:
    return f"memory-slice-{i}"


def instances_counter(profile: MigProfile) -> str:
    return f"profile-{profile.profile_id}-instances"


@dataclass(frozen=True)
class MigGeometry:
    grid: int  # placement units of the memory axis
    compute_slices: int
    engines: tuple[tuple[str, int], ...]  # counter name -> total, in ENGINES order

    def capacities(self, profiles: Iterable[MigProfile]) -> dict[str, int]:
        """Every limit a set of GPU instances must keep: memory units (1 each), compute
        slices, engines, and each profile's instance count."""
        caps = {memory_counter(i): 1 for i in range(self.grid)}
        caps[COMPUTE] = self.compute_slices
        caps.update(self.engines)
        for p in profiles:
            caps[instances_counter(p)] = p.instance_count
        return caps


def geometry(profiles: Iterable[MigProfile]) -> MigGeometry:
    ps = list(profiles)
    if not ps:
        return MigGeometry(DEFAULT_GRID, 0, tuple((e, 0) for e in ENGINES))
    grid = max(s + p.memory_slices for p in ps for s in (p.placements or (0,)))
    return MigGeometry(
        grid=grid,
        compute_slices=max(p.compute_slices for p in ps),
        engines=tuple((e, max(getattr(p, f) for p in ps)) for e, f in ENGINES.items()),
    )


def demand(profile: MigProfile, start: int) -> dict[str, int]:
    """What one GPU instance of `profile` at `start` takes of every limit."""
    d = {memory_counter(i): 1 for i in profile.memory_range(start)}
    d[COMPUTE] = profile.compute_slices
    for e, f in ENGINES.items():
        if getattr(profile, f):
            d[e] = getattr(profile, f)
    d[instances_counter(profile)] = 1
    return d


def fits(taken: Iterable[dict[str, int]], new: dict[str, int], caps: dict[str, int]) -> bool:
    """Whether a GPU instance demanding `new` can join instances that took `taken`."""
    used: dict[str, int] = {}
    for d in taken:
        for c, v in d.items():
            used[c] = used.get(c, 0) + v
    return all(used.get(c, 0) + v <= caps.get(c, 0) for c, v in new.items())
