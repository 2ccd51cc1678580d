"""The slices of every Kubernetes line from 1.34 to 1.37: each line's rules kept (as its
API server's validation has them: dradriver.k8s.lines), the same devices and counter sets
whatever the layout, and the order the allocator walks them still the packing policy."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from dradriver.health.model import Fault
from dradriver.inventory.node_devices import MigMode
from dradriver.k8s.lines import LINES, NEWEST, OLDEST, Line, LineError, line, parse_version
from dradriver.slices.build import LimitError, SliceContent, build, check_limits
from dradriver.slices.publish import render, slice_name
from dradriver.slices.taints import TaintEffect, with_taints
from tests.support.gpu_names import indexed, names_of
from tests.support.inventory import inventory

SPECS = ("8xH100-80GB", "8xH200-141GB", "8xA100-40GB:mig=on", "4xA100-80GB+2xL4+2xT4", "4xGB200")
L134, L135, L136, L137 = LINES


def devices(slices: list[SliceContent]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s.devices]


def counter_sets(slices: list[SliceContent]) -> list[dict[str, Any]]:
    return [cs for s in slices for cs in s.shared_counters]


def as_json(items: list[dict[str, Any]]) -> Counter[str]:
    import json

    return Counter(json.dumps(i, sort_keys=True) for i in items)


def in_name_order(slices: list[SliceContent]) -> list[SliceContent]:
    """The node's slices as 1.36's allocator walks them: by slice name."""
    return sorted(slices, key=lambda s: slice_name("node-a", "gpu.dradriver.io", s.key))


def test_versions_name_their_line() -> None:
    assert parse_version("v1.37.2") == parse_version("1.37") == 37
    assert parse_version("v1.36.3-eks-4f2b1c9") == 36
    assert line("v1.35.4") is L135
    assert line("v1.38.0-beta.0").minor == 38 and line("1.38").counters_apart
    with pytest.raises(LineError, match="older than this driver supports"):
        line("v1.33.5")
    with pytest.raises(LineError, match="not a Kubernetes version"):
        line("v2.0.0")


def test_what_1_36_turns_on_needs_no_gate_there() -> None:
    assert L134.gates_to_turn_on() == L135.gates_to_turn_on()
    assert set(L134.gates_to_turn_on()) >= {"DRAPartitionableDevices", "DRAConsumableCapacity"}
    assert L136.gates_to_turn_on() == L137.gates_to_turn_on() == ()
    assert not L135.claim_status_per_driver and L136.claim_status_per_driver


@pytest.mark.parametrize("ln", LINES, ids=lambda ln: ln.name)
def test_every_line_mode_and_fleet_keeps_the_lines_rules(ln: Line) -> None:
    for spec in SPECS:
        inv = inventory(spec)
        for mode in MigMode:
            result = build(inv, mode, line=ln)
            check_limits(result.slices, ln)
            if not ln.counters_apart:
                continue
            for s in result.slices:
                assert not (s.devices and s.shared_counters), s.key
                assert len(s.shared_counters) <= 8
                assert len(s.devices) <= 64
            # Taints on every device (a node of sick GPUs) keep within the limits too.
            faults = {d["name"]: Fault("xid-79", 1) for d in devices(result.slices)}
            tainted = with_taints(result.slices, faults, "d", effect=TaintEffect.NO_SCHEDULE)
            check_limits(tainted, ln)


@pytest.mark.parametrize("mode", list(MigMode), ids=str)
def test_the_layout_moves_devices_and_counters_and_changes_nothing_else(mode: MigMode) -> None:
    for spec in SPECS:
        inv = inventory(spec)
        old = build(inv, mode, line=OLDEST).slices
        for ln in LINES[1:]:
            new = build(inv, mode, line=ln).slices
            assert as_json(devices(new)) == as_json(devices(old)), (spec, ln.name)
            assert as_json(counter_sets(new)) == as_json(counter_sets(old)), (spec, ln.name)


def test_from_1_35_counter_sets_live_apart_and_devices_find_them_in_the_pool() -> None:
    inv = inventory("8xH100-80GB")
    slices = build(inv, MigMode.DYNAMIC, line=L135).slices
    keys = [s.key for s in slices]
    assert keys == ["counters-0", "devices-00", "devices-01", "devices-02", "devices-03"]
    sets = {cs["name"] for cs in counter_sets(slices)}
    assert sets == set(names_of(inv)) and len(slices[0].shared_counters) == 8
    used = {c["counterSet"] for d in devices(slices) for c in d.get("consumesCounters", ())}
    assert used == sets
    # Published, the counter slice names no devices (an empty list is "set" to 1.35's
    # validation) and every slice is one pool of one generation, counters included.
    docs = render("gpu.dradriver.io", "node-a", slices)
    assert "devices" not in docs[0]["spec"] and docs[0]["spec"]["sharedCounters"]
    assert all("sharedCounters" not in d["spec"] for d in docs[1:])
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in docs} == {len(slices)}


def test_from_1_35_a_gpus_partitions_stay_in_one_slice_and_slices_hold_at_most_64() -> None:
    """In 1.35 the allocator walks a node's slices in no set order: a GPU split across two
    could be started in the second while the first still has room."""
    inv = inventory("8xH100-80GB")
    gpus = names_of(inv)
    for ln in (L135, L137):
        slices = [s for s in build(inv, MigMode.DYNAMIC, line=ln).slices if s.devices]
        home: dict[str, set[str]] = {}
        for s in slices:
            assert len(s.devices) <= 64
            for d in s.devices:
                parent = next(g for g in gpus if d["name"].startswith(g))
                if d["attributes"]["type"]["string"] == "mig":
                    home.setdefault(parent, set()).add(s.key)
        assert all(len(keys) == 1 for keys in home.values()), home


def test_from_1_36_the_name_order_is_the_packing_order() -> None:
    """Walked by slice name (1.36's allocator), the devices come in 1.34's order within a
    slice: whole GPUs from the lowest index up, then partitions GPU by GPU from the
    highest down, so that partitions fill one GPU before they break into the next."""
    inv = inventory("8xH100-80GB")
    gpus = names_of(inv)
    slices = in_name_order(build(inv, MigMode.DYNAMIC, line=L136).slices)
    walked = [indexed(d["name"], gpus) for s in slices for d in s.devices]
    wholes = [w for w in walked if "-mig-" not in w]
    assert walked[:8] == wholes == [f"gpu-{i}" for i in range(8)]
    parents = [w.split("-mig-")[0] for w in walked[8:]]
    assert list(dict.fromkeys(parents)) == [f"gpu-{i}" for i in range(7, -1, -1)]


def test_long_node_names_keep_the_key_order() -> None:
    node = "n" * 250
    names = [slice_name(node, "gpu.dradriver.io", k) for k in ("devices-00", "devices-01")]
    assert all(len(n) <= 253 for n in names) and names == sorted(names)
    assert names[0].endswith("devices-00")


def test_1_35_limits_fail_loudly() -> None:
    both = SliceContent(
        key="k",
        devices=({"name": "gpu-0", "attributes": {}},),
        shared_counters=({"name": "gpu-0", "counters": {"a": {"value": "1"}}},),
    )
    check_limits([both], OLDEST)  # 1.34 wants them together
    with pytest.raises(LimitError, match="devices and counter sets in one slice"):
        check_limits([both], L135)
    nine = SliceContent(
        key="c",
        devices=(),
        shared_counters=tuple({"name": f"s{i}", "counters": {}} for i in range(9)),
    )
    with pytest.raises(LimitError, match="9 counter sets > 8"):
        check_limits([nine], NEWEST)
    tainted = SliceContent(
        key="t",
        devices=tuple(
            {"name": f"gpu-{i}", "attributes": {}, "taints": [{"key": "k", "effect": "NoSchedule"}]}
            for i in range(65)
        ),
    )
    check_limits([tainted], OLDEST)
    with pytest.raises(LimitError, match="65 devices > 64"):
        check_limits([tainted], L135)
