"""The order partitions are published in is the packing policy: the scheduler gives a
request the first device that fits, walking a slice's devices in order (and the node's
slices, one per GPU in dynamic mode, in the informer's order, which is random: v0.34.4
structured/internal/experimental/pools_experimental.go keeps the lister's order). A
stream of mixed MIG claims, first fit as the scheduler walks them, against ascending
placements and against the best packing possible."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from dradriver.inventory.node_devices import MigMode, partitions
from dradriver.slices import counters as ctr
from dradriver.slices.build import build

from .conftest import inventory

KINDS = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
WEIGHTS = [4, 2, 3, 2, 1, 1]
Order = list[list[tuple[str, dict[str, int]]]]  # per GPU: (profile, consumption) in order


def published_order() -> tuple[Order, dict[str, int]]:
    """What the scheduler walks: each GPU's slice, its partitions in device order."""
    result = build(inventory("2xH100-80GB"), MigMode.DYNAMIC)
    order: Order = []
    caps: dict[str, int] = {}
    for s in result.slices:
        caps = {c: int(v["value"]) for c, v in s.shared_counters[0]["counters"].items()}
        order.append(
            [
                (
                    d["attributes"]["profile"]["string"],
                    {c: int(v["value"]) for c, v in d["consumesCounters"][0]["counters"].items()},
                )
                for d in s.devices
                if d["attributes"]["type"]["string"] == "mig"
            ]
        )
    return order, caps


def ascending_order() -> Order:
    gpu = inventory("2xH100-80GB").gpus[0]
    design = ctr.design(gpu.mig_profiles)
    one = [(p.profile.name, design.consumption[p]) for p in partitions(gpu.mig_profiles)]
    return [one, list(one)]


def first_fit(stream: Sequence[str], order: Order, caps: dict[str, int]) -> int:
    used: list[dict[str, int]] = [{} for _ in order]
    placed = 0
    rng = random.Random(len(stream) * 31 + sum(map(len, stream)))  # same walk for each order
    for want in stream:
        gpus = list(range(len(order)))
        rng.shuffle(gpus)
        for g in gpus:
            devices = order[g]
            hit = next(
                (c for name, c in devices if name == want and ctr.fits(used[g], c, caps)), None
            )
            if hit is not None:
                for k, v in hit.items():
                    used[g][k] = used[g].get(k, 0) + v
                placed += 1
                break
    return placed


def best(stream: Sequence[str], order: Order, caps: dict[str, int]) -> int:
    """The most claims of the stream that can hold devices together, by exhaustive search."""
    options = {name: [c for n, c in order[0] if n == name] for name in set(stream)}

    def fit(i: int, used: list[dict[str, int]], left: int) -> int:
        if i == len(stream):
            return 0
        top = fit(i + 1, used, left)  # this claim stays pending
        for g in range(len(used)):
            for c in options[stream[i]]:
                if ctr.fits(used[g], c, caps):
                    nxt = [dict(u) for u in used]
                    for k, v in c.items():
                        nxt[g][k] = nxt[g].get(k, 0) + v
                    top = max(top, 1 + fit(i + 1, nxt, left))
                    if top == len(stream) - i:
                        return top
        return top

    return fit(0, [{} for _ in order], len(stream))


def total(streams: list[list[str]], how: Callable[..., int], order: Order, caps: Any) -> int:
    return sum(how(s, order, caps) for s in streams)


def test_published_order_packs_better_than_ascending_and_near_the_best() -> None:
    """Measured (seeds 7, 8, 9; 200 streams of 3 to 6 claims each): on one H100 the
    published order places 1889 claims, ascending placements 1855, the best possible
    2081; on two H100s 2480, 2450 and 2582."""
    ours, caps = published_order()
    ascending = ascending_order()
    for gpus in (1, 2):
        placed = upward = optimum = 0
        for seed in (7, 8, 9):
            rng = random.Random(seed)
            streams = [rng.choices(KINDS, WEIGHTS, k=rng.randint(3, 6)) for _ in range(200)]
            placed += total(streams, first_fit, ours[:gpus], caps)
            upward += total(streams, first_fit, ascending[:gpus], caps)
            optimum += total(streams, best, ours[:gpus], caps)
        assert placed > upward, (gpus, placed, upward, optimum)
        assert placed >= 0.9 * optimum, (gpus, placed, upward, optimum)


def test_the_order_keeps_the_low_end_for_4g_and_the_last_slice_for_who_can_use_it() -> None:
    result = build(inventory("2xH100-80GB"), MigMode.DYNAMIC)

    def first(profile: str) -> str:
        return next(d["name"] for d in result.slices[0].devices if f"-mig-{profile}-" in d["name"])

    assert first("3g40gb") == "gpu-0-mig-3g40gb-4"  # ends on the last slice: from the top
    assert first("1g20gb") == "gpu-0-mig-1g20gb-6"
    assert first("1g10gb") == "gpu-0-mig-1g10gb-0"  # cannot reach it: from the bottom
    assert first("2g20gb") == "gpu-0-mig-2g20gb-0"
