"""The MIG admission rules, on their own and against the fake's create/destroy behaviour."""

from __future__ import annotations

import ctypes
import random

import pytest

from fakenvml import load, mig_rules, products
from fakenvml.mig_rules import Violation, admissible, conflicts, violation

P = {p.name: p for p in products.A100_40GB.gi_profiles}
MIG_PRODUCTS = [p for p in products.PRODUCTS.values() if p.mig_capable]


def at(name: str, start: int) -> mig_rules.Placed:
    return (P[name], start)


@pytest.mark.parametrize(
    "layout",
    [
        [at("3g.20gb", 0), at("3g.20gb", 4)],
        [at("4g.20gb", 0), at("2g.10gb", 4), at("1g.5gb", 6)],
        [at("1g.10gb", s) for s in (0, 2, 4, 6)],
        [at("1g.5gb", s) for s in range(7)],
        [at("4g.20gb", 0), at("3g.20gb", 4)],
        [at("1g.5gb+me", 3), at("2g.10gb", 0), at("1g.5gb", 2), at("3g.20gb", 4)],
        [at("7g.40gb", 0)],
        [],
    ],
)
def test_known_valid_layouts(layout) -> None:
    assert admissible(layout)


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ([at("4g.20gb", 0), at("3g.20gb", 0)], Violation.MEMORY_OVERLAP),
        ([at("7g.40gb", 0), at("1g.5gb", 6)], Violation.MEMORY_OVERLAP),
        ([at("2g.10gb", 2), at("1g.10gb", 2)], Violation.MEMORY_OVERLAP),
        ([at("1g.5gb+me", 0), at("1g.5gb+me", 5)], Violation.ENGINES_EXHAUSTED),
        ([at("3g.20gb", 2)], Violation.BAD_PLACEMENT),
        ([at("1g.5gb", 7)], Violation.BAD_PLACEMENT),
        ([at("4g.20gb", 4)], Violation.BAD_PLACEMENT),
    ],
)
def test_known_invalid_layouts(layout, why: Violation) -> None:
    assert violation(layout) is why
    assert not admissible(layout)


def test_compute_slices_are_the_limit_when_memory_is_not() -> None:
    # 7 single slices use compute slices 0..6 and leave memory slice 7 free, but nothing
    # can use it alone.
    full = [at("1g.5gb", s) for s in range(7)]
    assert mig_rules.remaining_capacity(full, P["1g.10gb"]) == 0
    sliced = [at("2g.10gb", 0), at("2g.10gb", 2), at("2g.10gb", 4), at("1g.10gb", 6)]
    assert admissible(sliced)
    sliced_plus = [*sliced, at("1g.5gb", 6)]
    assert not admissible(sliced_plus)


def test_conflicts_is_symmetric_and_pairwise() -> None:
    cands = [(p, s) for p in P.values() for s in p.placement_starts]
    for a in cands:
        for b in cands:
            assert conflicts(a, b) == conflicts(b, a)
            if a is not b:
                assert conflicts(a, b) == (not admissible([a, b]))


def test_gpu_instance_ids() -> None:
    assert mig_rules.gpu_instance_id(P["7g.40gb"], 0) == 0
    assert [mig_rules.gpu_instance_id(P["3g.20gb"], s) for s in (0, 4)] == [1, 2]
    assert [mig_rules.gpu_instance_id(P["2g.10gb"], s) for s in (0, 2, 4)] == [3, 4, 5]
    assert [mig_rules.gpu_instance_id(P["1g.5gb"], s) for s in range(7)] == list(range(7, 14))


def _all_layouts(product: products.Product) -> list[list[mig_rules.Placed]]:
    cands = [(p, s) for p in product.gi_profiles for s in p.placement_starts]
    seen: dict[frozenset, list[mig_rules.Placed]] = {}
    stack: list[list[mig_rules.Placed]] = [[]]
    while stack:
        layout = stack.pop()
        key = frozenset((p.id, s) for p, s in layout)
        if key in seen:
            continue
        seen[key] = layout
        stack.extend([*layout, c] for c in cands if admissible([*layout, c]))
    return list(seen.values())


class _Gpu:
    """GPU 0 of a fresh fake node with MIG on, driven through pynvml only."""

    def __init__(self, product: products.Product) -> None:
        self.nvml = load(f"1x{product.key}:mig=on", node="rules", state_dir=None).pynvml
        self.nvml.nvmlInit()
        self.h = self.nvml.nvmlDeviceGetHandleByIndex(0)

    def create(self, profile: products.GpuInstanceProfile, start: int):
        """The GPU instance handle, or the pynvml exception class raised."""
        placement = self.nvml.c_nvmlGpuInstancePlacement_t(start, profile.memory_slices)
        try:
            return self.nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                self.h, profile.id, ctypes.byref(placement)
            )
        except self.nvml.NVMLError as err:
            return type(err)

    def expected(self, layout, profile, start):
        if start not in profile.placement_starts:
            return self.nvml.NVMLError_InvalidArgument
        if admissible([*layout, (profile, start)]):
            return None
        return self.nvml.NVMLError_InsufficientResources


def test_fake_agrees_with_the_rules_on_every_layout() -> None:
    """Every admissible A100 layout is creatable, and from each one every next instance
    (including placements that do not exist) succeeds or fails as the rules say."""
    product = products.A100_40GB
    gpu = _Gpu(product)
    nvml = gpu.nvml
    tries = [(p, s) for p in product.gi_profiles for s in range(8)]
    layouts = _all_layouts(product)
    assert len(layouts) > 2000
    for layout in layouts:
        made = []
        for p, s in layout:
            gi = gpu.create(p, s)
            assert not isinstance(gi, type), (layout, p.name, s, gi)
            made.append(gi)
        for p, s in tries:
            result = gpu.create(p, s)
            want = gpu.expected(layout, p, s)
            if want is None:
                assert not isinstance(result, type), ([(q.name, t) for q, t in layout], p.name, s)
                nvml.nvmlGpuInstanceDestroy(result)
            else:
                assert result is want, ([(q.name, t) for q, t in layout], p.name, s, result)
        for p in product.gi_profiles:
            capacity = nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu.h, p.id)
            assert capacity == mig_rules.remaining_capacity(layout, p)
        for gi in made:
            nvml.nvmlGpuInstanceDestroy(gi)


@pytest.mark.parametrize("product", MIG_PRODUCTS, ids=lambda p: p.key)
def test_fake_agrees_with_the_rules_on_random_sequences(product: products.Product) -> None:
    rng = random.Random(f"mig-{product.key}")
    gpu = _Gpu(product)
    nvml = gpu.nvml
    tries = [
        (p, s)
        for p in product.gi_profiles
        for s in range(product.gi_profiles[0].geometry.memory_slices)
    ]
    for _ in range(40):
        layout: list[tuple[mig_rules.Placed, object]] = []
        for _step in range(25):
            if layout and rng.random() < 0.3:
                _, gi = layout.pop(rng.randrange(len(layout)))
                nvml.nvmlGpuInstanceDestroy(gi)
                continue
            p, s = rng.choice(tries)
            current = [placed for placed, _ in layout]
            result = gpu.create(p, s)
            want = gpu.expected(current, p, s)
            if want is None:
                assert not isinstance(result, type)
                layout.append(((p, s), result))
            else:
                assert result is want
            infos = [nvml.nvmlGpuInstanceGetInfo(gi) for _, gi in layout]
            assert sorted((i.profileId, i.placement.start) for i in infos) == sorted(
                (q.id, t) for (q, t), _ in layout
            )
        for _, gi in layout:
            nvml.nvmlGpuInstanceDestroy(gi)
