"""--mig-profiles: dynamic mode offers partitions of the chosen profiles only, fewer bytes
for the API server and the scheduler, and never drops a partition a claim holds."""

from __future__ import annotations

import json
from typing import Any

from dradriver.flags import mig_profiles
from dradriver.slices.build import MigMode, build
from dradriver.slices.publish import render
from tests.support.inventory import inventory


def offered(profiles: str, owned: tuple[tuple[str, int, int], ...] = ()) -> list[dict[str, Any]]:
    inv = inventory("1xH100-80GB")
    result = build(inv, MigMode.DYNAMIC, owned, profiles=mig_profiles(profiles))
    return render("gpu.dradriver.io", "node-a", result.slices)


def profiles_of(slices: list[dict[str, Any]]) -> list[str]:
    return sorted(
        {
            d["attributes"].get("profile", {}).get("string", "whole")
            for s in slices
            for d in s["spec"]["devices"]
        }
    )


def test_only_the_chosen_profiles_are_offered() -> None:
    every, chosen = offered(""), offered(" 1g.10gb , 3g.40gb ")
    assert profiles_of(every) == [
        "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "whole"
    ]  # fmt: skip
    assert profiles_of(chosen) == ["1g.10gb", "3g.40gb", "whole"]
    # 7 one-slice placements + 2 three-slice ones + the whole GPU, and well under half
    # the bytes of every profile.
    assert sum(len(s["spec"]["devices"]) for s in chosen) == 10
    assert len(json.dumps(chosen)) < len(json.dumps(every)) / 2
    # The counters still describe the whole GPU.
    assert chosen[0]["spec"]["sharedCounters"] == every[0]["spec"]["sharedCounters"]


def test_a_partition_a_claim_holds_stays_offered_whatever_the_choice() -> None:
    inv = inventory("1xH100-80GB")
    gpu = inv.gpus[0]
    (seven,) = [p for p in gpu.mig_profiles if p.name == "7g.80gb"]
    held = ((gpu.uuid, seven.profile_id, 0),)
    assert "7g.80gb" in profiles_of(offered("1g.10gb", held))
    assert "7g.80gb" not in profiles_of(offered("1g.10gb"))


def test_the_flag_reads_a_comma_separated_list() -> None:
    assert mig_profiles("") == frozenset()
    assert mig_profiles("1g.10gb,,3g.40gb ") == {"1g.10gb", "3g.40gb"}
