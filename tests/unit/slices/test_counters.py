"""The shared counters admit exactly the MIG layouts NVML admits, and no counter is
superfluous. Proven by enumeration over every combination of placements of one GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest

from dradriver.slices import counters as ctr
from fakenvml import mig_rules, products
from tests.support.inventory import inventory

# Every MIG product of the fake (A30's 4-slice and RTX PRO's 12-unit grids included).
MIG_PRODUCTS = [k for k, p in products.PRODUCTS.items() if p.mig_capable]
EIGHT_SLICE = {k for k, p in products.PRODUCTS.items() if p.mig_capable and len(p.gi_profiles) == 7}


def sets_admitted_by(
    parts: Sequence[ctr.Partition], ok: Callable[[list[ctr.Partition]], bool]
) -> set[frozenset[ctr.Partition]]:
    """All non-empty sets of partitions that `ok` accepts, grown one partition at a time
    (both the counters and NVML's rules are closed under taking subsets)."""
    out: set[frozenset[ctr.Partition]] = set()

    def walk(i: int, chosen: list[ctr.Partition]) -> Iterator[None]:
        for j in range(i, len(parts)):
            chosen.append(parts[j])
            if ok(chosen):
                out.add(frozenset(chosen))
                yield from walk(j + 1, chosen)
            chosen.pop()
        yield None

    for _ in walk(0, []):
        pass
    return out


def rules_for(product: str) -> Callable[[list[ctr.Partition]], bool]:
    prod = products.product(product)
    assert prod is not None

    def ok(chosen: list[ctr.Partition]) -> bool:
        placed = []
        for p in chosen:
            gi = prod.gi_profile_by_id(p.profile.profile_id)
            assert gi is not None
            placed.append((gi, p.start))
        return mig_rules.admissible(placed)

    return ok


def counters_for(
    design: ctr.CounterDesign, caps: dict[str, int]
) -> Callable[[list[ctr.Partition]], bool]:
    def ok(chosen: list[ctr.Partition]) -> bool:
        used: dict[str, int] = {}
        for p in chosen:
            for c, v in design.consumption[p].items():
                if c in caps:
                    used[c] = used.get(c, 0) + v
        return all(v <= caps[c] for c, v in used.items())

    return ok


@pytest.mark.parametrize("product", MIG_PRODUCTS)
def test_counters_admit_exactly_the_layouts_nvml_admits(product: str) -> None:
    gpu = inventory(f"1x{product}").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    parts = ctr.partitions(gpu.mig_profiles)
    by_rules = sets_admitted_by(parts, rules_for(product))
    by_counters = sets_admitted_by(parts, counters_for(design, design.capacities))
    if product in EIGHT_SLICE:
        assert len(parts) == 25  # 7 + 7 (+me) + 4 + 3 + 2 + 1 + 1 placements
        assert len(by_rules) > 2000  # the enumeration really covers the layout space
    else:
        assert len(by_rules) > 70
    assert by_counters == by_rules
    # The generic enumerator used at design time agrees with this one.
    assert {
        frozenset(s) for s in ctr.admitted_sets(parts, design.capacities, design.consumption)
    } == by_rules


@pytest.mark.parametrize("product", MIG_PRODUCTS)
def test_every_counter_is_needed(product: str) -> None:
    gpu = inventory(f"1x{product}").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    parts = ctr.partitions(gpu.mig_profiles)
    by_rules = sets_admitted_by(parts, rules_for(product))
    for dropped in design.capacities:
        caps = {c: v for c, v in design.capacities.items() if c != dropped}
        looser = sets_admitted_by(parts, counters_for(design, caps))
        assert looser > by_rules, f"{dropped} could be dropped"


def test_the_smallest_design_for_a100_and_h100_geometry() -> None:
    """Memory slice 7 is only ever used together with slice 6, and the compute limit and
    the decoders and JPEG engines follow from the memory geometry: 7 memory counters and
    the one OFA (what makes a single +me instance per GPU) remain."""
    gpu = inventory("1xH100-80GB").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    assert list(design.capacities) == [f"memory-slice-{i}" for i in range(7)] + ["ofa-engines"]
    assert all(v == 1 for v in design.capacities.values())


def test_the_smallest_design_for_rtx_pro_6000() -> None:
    """A 12-unit grid whose units go three together (4 memory counters), the 4 decoders
    that a +me.all instance takes all of (NVENC and JPEG bind exactly as NVDEC does), and
    the one OFA shared by +me, +me.all and 4g."""
    gpu = inventory("1xRTX-PRO-6000").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    assert design.capacities == {
        "memory-slice-0": 1,
        "memory-slice-3": 1,
        "memory-slice-6": 1,
        "memory-slice-9": 1,
        "decoders": 4,
        "ofa-engines": 1,
    }


def test_the_smallest_design_for_a30() -> None:
    gpu = inventory("1xA30").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    assert list(design.capacities) == [f"memory-slice-{i}" for i in range(4)] + ["ofa-engines"]


def test_whole_gpu_excludes_every_partition() -> None:
    gpu = inventory("1xH100-80GB").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    whole = design.whole_gpu()
    for part, consumption in design.consumption.items():
        assert not ctr.fits(whole, consumption, design.capacities), part
