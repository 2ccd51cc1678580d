"""Consumable capacity, pure: the flag's modes, what 1.34 refuses, and the fields each
mode publishes, checked against the API server's own rules for a requestPolicy
(v1.34.4 pkg/apis/resource/validation, validateRequestPolicyRange and friends)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dradriver.api.quantity import parse
from dradriver.inventory.node_devices import MigMode
from dradriver.nvml.discover import discover
from dradriver.slices.build import build
from dradriver.slices.consumable import (
    OFF,
    Consumable,
    ConsumableMode,
    ConsumableModeError,
    capacity,
    check_mig_mode,
    parse_mode,
)
from fakenvml import load
from tests.support.gpu_names import names_of

H100_MEMORY = 81559 * 2**20  # fakenvml's H100 80GB: nvidia-smi's 81559 MiB


def inventory(spec: str, mig_3g40gb: bool = False) -> Any:
    fake = load(spec, node="node-a")
    if mig_3g40gb:  # GPU 1: one 3g.40gb MIG device at placement 4
        gi = fake.machine.create_gpu_instance(1, 9, 4)
        fake.machine.create_compute_instance(1, gi.id, 2, None)
    fake.pynvml.nvmlInit()
    return discover(fake.pynvml).inventory


def check_policy(value: str, policy: dict[str, Any]) -> None:
    """The API server's rules for a capacity's requestPolicy with a validRange."""
    cap = parse(value)
    default = parse(policy["default"])
    rng = policy["validRange"]
    lo = parse(rng["min"])
    assert 0 <= lo <= cap, "min within the capacity"
    assert default >= lo, "default at least min"
    if "max" in rng:
        hi = parse(rng["max"])
        assert lo <= hi <= cap and default <= hi
    if "step" in rng:
        step = parse(rng["step"])
        assert lo + step <= cap, "one step within the capacity"
        assert (default - lo) % step == 0, "default a whole number of steps from min"
        if "max" in rng:
            assert (parse(rng["max"]) - lo) % step == 0


@pytest.mark.parametrize(
    "text, want",
    [
        ("off", OFF),
        ("", OFF),
        ("memory", Consumable(ConsumableMode.MEMORY)),
        ("unlimited", Consumable(ConsumableMode.UNLIMITED)),
        ("shares=4", Consumable(ConsumableMode.SHARES, 4)),
        ("shares=1", Consumable(ConsumableMode.SHARES, 1)),
    ],
)
def test_modes(text: str, want: Consumable) -> None:
    assert parse_mode(text) == want


@pytest.mark.parametrize(
    "text, message",
    [
        ("shares=0", "from 1 to 48"),
        ("shares=49", "from 1 to 48"),
        ("shares=x", "from 1 to 48"),
        ("memroy", "expected off, memory, shares=N or unlimited"),
        ("shares", "expected off, memory, shares=N or unlimited"),
    ],
)
def test_bad_modes_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(ConsumableModeError, match=message) as e:
        parse_mode(text)
    assert "--consumable-capacity" in str(e.value)


def test_dynamic_mig_is_refused_naming_both_flags() -> None:
    for mode in (MigMode.NONE, MigMode.STATIC):
        check_mig_mode(parse_mode("memory"), mode)
    check_mig_mode(OFF, MigMode.DYNAMIC)
    with pytest.raises(ConsumableModeError) as e:
        check_mig_mode(parse_mode("shares=2"), MigMode.DYNAMIC)
    assert "--consumable-capacity=shares=2" in str(e.value)
    assert "--mig-mode=dynamic" in str(e.value)


MIXED = "1xH100-80GB+1xH100-80GB:mig=on+1xL4"  # whole GPUs, and a MIG device in static mode
SHARING = {"allowMultipleAllocations"}  # the only field a mode adds to a device


def test_off_publishes_what_it_always_did() -> None:
    """Off, in every MIG mode: one claim a device, and each capacity a bare value that a
    claim takes whole, as before consumable capacity existed."""
    inv = inventory(MIXED, mig_3g40gb=True)
    for mode in (MigMode.NONE, MigMode.STATIC, MigMode.DYNAMIC):
        devices = [d for s in build(inv, mode).slices for d in s.devices]
        assert devices, mode
        for d in devices:
            assert not SHARING & set(d), (mode, d["name"])
            assert all(set(c) == {"value"} for c in d["capacity"].values()), (mode, d["name"])


@pytest.mark.parametrize("text", ["memory", "shares=1", "shares=4", "unlimited"])
def test_a_mode_changes_capacities_and_sharing_and_nothing_else(text: str) -> None:
    """What a claim selects by stays as off publishes it: the slices, the device names,
    their order and attributes, and the value of every capacity. A mode adds only
    allowMultipleAllocations, a requestPolicy to each capacity, and capacities a share
    is counted in."""
    c = parse_mode(text)
    inv = inventory(MIXED, mig_3g40gb=True)
    for mode in (MigMode.NONE, MigMode.STATIC):
        off, on = build(inv, mode).slices, build(inv, mode, consumable=c).slices
        assert [s.key for s in on] == [s.key for s in off]
        assert [s.shared_counters for s in on] == [s.shared_counters for s in off]
        pairs = [
            (a, b)
            for s, t in zip(on, off, strict=True)
            for a, b in zip(s.devices, t.devices, strict=True)
        ]
        assert len(pairs) == sum(len(s.devices) for s in off) > 0
        for shared, alone in pairs:
            where = (mode, alone["name"])
            assert shared["allowMultipleAllocations"] is True, where
            rest = {k: v for k, v in shared.items() if k not in SHARING | {"capacity"}}
            assert rest == {k: v for k, v in alone.items() if k != "capacity"}, where
            cap, was = shared["capacity"], alone["capacity"]
            assert {k: cap[k]["value"] for k in was} == {k: v["value"] for k, v in was.items()}
            assert all("requestPolicy" in v for v in cap.values()), where
            added = set(cap) - set(was)
            assert "compute" in added and added <= {"compute", "multiprocessors", "shares"}
            assert ("shares" in added) == (c.mode is ConsumableMode.SHARES), where


@pytest.mark.parametrize("mode", ["memory", "shares=1", "shares=4", "unlimited"])
def test_every_capacity_has_a_valid_policy(mode: str) -> None:
    c = parse_mode(mode)
    for memory, sms in ((H100_MEMORY, None), (H100_MEMORY, 132), (512 * 2**20, 14)):
        for value in capacity(c, memory, sms).values():
            check_policy(value["value"], value["requestPolicy"])


def test_memory_mode_defaults_to_the_whole_device_in_1mi_steps() -> None:
    cap = capacity(parse_mode("memory"), H100_MEMORY, None)
    assert cap["memory"]["value"] == str(H100_MEMORY)
    assert cap["memory"]["requestPolicy"] == {
        "default": "81559Mi",
        "validRange": {"min": "1024Mi", "step": "1Mi"},
    }
    # A claim that asks for nothing takes no compute: the next one can still ask for it.
    assert cap["compute"] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
    }
    assert set(cap) == {"memory", "compute"}


def test_shares_and_unlimited_consume_memory_only_when_asked() -> None:
    shares = capacity(parse_mode("shares=4"), H100_MEMORY, None)
    assert shares["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    assert shares["memory"]["requestPolicy"]["default"] == "0"
    assert (
        "step"
        not in capacity(parse_mode("shares=1"), H100_MEMORY, None)["shares"]["requestPolicy"][
            "validRange"
        ]
    )
    unlimited = capacity(parse_mode("unlimited"), H100_MEMORY, None)
    assert set(unlimited) == {"memory", "compute"}
    assert unlimited["memory"]["requestPolicy"]["default"] == "0"


def test_whole_gpus_and_existing_mig_devices_are_shared_partitions_never() -> None:
    inv = inventory("1xH100-80GB+1xH100-80GB:mig=on", mig_3g40gb=True)
    c = parse_mode("memory")
    devices = [d for s in build(inv, MigMode.STATIC, consumable=c).slices for d in s.devices]
    by_name = {d["name"]: d for d in devices}
    assert by_name[names_of(inv)[0]]["allowMultipleAllocations"] is True
    migs = [d for d in devices if d["attributes"]["type"]["string"] == "mig"]
    assert migs and all(d["allowMultipleAllocations"] for d in migs)
    for d in migs:  # a MIG device's SMs are known: they get a policy too
        assert d["capacity"]["multiprocessors"]["requestPolicy"]["default"] == "0"
        assert Fraction(parse(d["capacity"]["memory"]["requestPolicy"]["default"])) <= int(
            d["capacity"]["memory"]["value"]
        )
    # Partitions never, even where build is asked to share them (the flags refuse dynamic
    # MIG beside consumable capacity): a partition's counters are not counted once shared.
    dynamic = [d for s in build(inv, MigMode.DYNAMIC, consumable=c).slices for d in s.devices]
    parts = [
        d for d in dynamic if "consumesCounters" in d and d["attributes"]["type"]["string"] == "mig"
    ]
    assert parts and not any(SHARING & set(d) for d in parts)
