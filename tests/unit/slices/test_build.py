"""inventory -> desired ResourceSlices: modes, attributes, names and the 1.34 limits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dradriver.inventory.model import Inventory
from dradriver.inventory.naming import uuid_digits
from dradriver.inventory.node_devices import profile_token
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import LimitError, MigMode, SliceContent, build, check_limits
from fakenvml.products import PRODUCTS
from tests.support.gpu_names import fake_names, indexed, names_of, real
from tests.support.inventory import inventory

A = "gpu.dradriver.io"


def by_index(inv: Inventory, names: list[str]) -> list[str]:
    """The device names the code wrote, in index form ("gpu-3-mig-3g40gb-4"); each must
    be named after one of the node's GPUs as its discovery named them."""
    gpus = names_of(inv)
    out = [indexed(n, gpus) for n in names]
    for n, i in zip(names, out, strict=True):
        assert i != n and real(i, gpus) == n, n
    return out


def devices(inv: Inventory, mode: MigMode) -> dict[str, dict]:  # type: ignore[type-arg]
    """The published devices by name in index form."""
    devs = [d for s in build(inv, mode).slices for d in s.devices]
    return dict(zip(by_index(inv, [d["name"] for d in devs]), devs, strict=True))


def test_dynamic_h100_node_offers_every_profile_and_placement() -> None:
    inv = inventory("8xH100-80GB")
    result = build(inv, MigMode.DYNAMIC)
    # Each GPU is named after its UUID; a merged slice after its first GPU.
    gpu = names_of(inv)
    assert gpu == [f"gpu-{uuid_digits(g.uuid)[:8]}" for g in inv.gpus]
    # Four GPUs a slice: each has 8 counters and a slice holds 32 (counters live in the
    # slice of the devices that consume them).
    assert [s.key for s in result.slices] == [
        f"gpus-{uuid_digits(inv.gpus[i].uuid)[:8]}" for i in (0, 4)
    ]
    for first, s in zip((0, 4), result.slices, strict=True):
        gpus = range(first, first + 4)
        assert [cs["name"] for cs in s.shared_counters] == [gpu[i] for i in gpus]
        names = by_index(inv, [d["name"] for d in s.devices])
        # The whole GPUs first, then each GPU's partitions, the highest GPU first.
        assert names[:4] == [f"gpu-{i}" for i in gpus]
        for i in gpus:
            mine = {n for n in names if n.startswith(f"gpu-{i}-")}
            expected = (
                {f"gpu-{i}-mig-1g10gb-{p}" for p in range(7)}
                | {f"gpu-{i}-mig-1g10gbme-{p}" for p in range(7)}
                | {f"gpu-{i}-mig-1g20gb-{p}" for p in (0, 2, 4, 6)}
                | {f"gpu-{i}-mig-2g20gb-{p}" for p in (0, 2, 4)}
                | {f"gpu-{i}-mig-3g40gb-{p}" for p in (0, 4)}
                | {f"gpu-{i}-mig-4g40gb-0", f"gpu-{i}-mig-7g80gb-0"}
            )
            assert mine == expected
        parents = [int(n.split("-")[1]) for n in names[4:]]
        assert parents == sorted(parents, reverse=True)
        for d in s.devices:
            assert d["consumesCounters"][0]["counterSet"] == "gpu-" + d["name"].split("-")[1]
    part = devices(inv, MigMode.DYNAMIC)["gpu-3-mig-3g40gb-4"]
    assert part["attributes"] == {
        "type": {"string": "mig"},
        "parentUUID": {"string": inv.gpus[3].uuid},
        "profile": {"string": "3g.40gb"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "resource.kubernetes.io/pcieRoot": {"string": inv.gpus[3].pcie_root},
    }  # no uuid: it does not exist until prepare carves it
    (three_g,) = [p for p in inv.gpus[3].mig_profiles if p.name == "3g.40gb"]
    assert part["capacity"] == {"memory": {"value": str(three_g.memory_bytes)}}
    consumed = part["consumesCounters"][0]["counters"]
    assert set(consumed) == {"memory-slice-4", "memory-slice-5", "memory-slice-6"}


def test_a_partition_costs_under_half_the_bytes_it_did() -> None:
    """Each partition is published some 200 times a node in dynamic mode: 893 bytes of
    JSON before its attributes were cut to what claims select by, 407 then; a node of 8
    H100s 199 KB before (8 slices), 99 KB then (2 slices), 102 KB since device names
    follow the UUID (gpu-6fafa41b-mig-...: 7 bytes more in each name and counter set)."""
    import json

    from dradriver.slices.publish import render as objects

    inv = inventory("8xH100-80GB")
    result = build(inv, MigMode.DYNAMIC)
    docs = objects(A, "node-a", result.slices)
    name = real("gpu-0-mig-1g10gb-0", names_of(inv))
    part = next(d for o in docs for d in o["spec"]["devices"] if d["name"] == name)
    assert len(json.dumps(part, separators=(",", ":"))) < 893 / 2
    assert sum(len(json.dumps(o, separators=(",", ":"))) for o in docs) < 104_000


def test_gpu_attributes_tell_the_truth() -> None:
    inv = inventory("4xA100-80GB:nvlink=pairs+2xL4", node="node-b")
    devs = devices(inv, MigMode.NONE)
    a0, a1, a2, l4 = (devs[f"gpu-{i}"]["attributes"] for i in (0, 1, 2, 4))
    assert a0["productName"] == {"string": "NVIDIA A100-SXM4-80GB"}
    assert a0["architecture"] == {"string": "Ampere"}
    assert a0["cudaComputeCapability"] == {"version": "8.0.0"}
    assert a0["driverVersion"] == {"version": "570.86.15"}
    assert a0["cudaDriverVersion"] == {"version": "12.8.0"}
    assert a0["migCapable"] == {"bool": True} and l4["migCapable"] == {"bool": False}
    assert a0["nvlinkDomain"] == a1["nvlinkDomain"] != a2["nvlinkDomain"]
    assert "nvlinkDomain" not in l4  # no NVLink, no domain: matchAttribute excludes it
    bus = a0["resource.kubernetes.io/pciBusID"]["string"]
    assert len(bus) == 12 and bus.count(":") == 2 and bus[4] == ":"
    assert a0["resource.kubernetes.io/pcieRoot"]["string"].startswith("pci")
    mem = devs["gpu-4"]["capacity"]["memory"]["value"]
    assert int(mem) == 23034 * 2**20  # the L4's memory as NVML reports it, in bytes


def test_mode_none_leaves_out_gpus_in_mig_mode_and_says_why() -> None:
    inv = inventory("2xA100-80GB:mig=on+1xL4")
    result = build(inv, MigMode.NONE)
    names = [d["name"] for s in result.slices for d in s.devices]
    assert by_index(inv, names) == ["gpu-2"]
    assert len(result.skipped) == 2 and "MIG mode is enabled" in result.skipped[0].message


def test_static_mode_publishes_existing_mig_devices_instead_of_their_gpu(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "gpus:\n- product: A100-80GB\n  count: 1\n  nvlink: none\n  mig: on\n"
        "  migDevices:\n  - {gpu: 0, profile: 3g.40gb, placement: 4}\n"
        "  - {gpu: 0, profile: 1g.10gb, placement: 0}\n"
        "- product: L4\n"
    )
    inv = open_nvml(f"fake:@{fleet}", node="n", state_dir=tmp_path).discover().inventory
    devs = devices(inv, MigMode.STATIC)
    assert set(devs) == {"gpu-0-mig-3g40gb-4", "gpu-0-mig-1g10gb-0", "gpu-1"}
    mig = devs["gpu-0-mig-3g40gb-4"]["attributes"]
    assert mig["uuid"]["string"].startswith("MIG-")
    assert mig["parentUUID"]["string"] == inv.gpus[0].uuid
    assert mig["productName"]["string"] == "NVIDIA A100-SXM4-80GB"  # the parent's facts
    assert "driverVersion" not in mig and "numaNode" not in mig  # the whole GPU's facts
    assert "consumesCounters" not in devs["gpu-0-mig-3g40gb-4"]

    # Dynamic mode on the same node: the existing (foreign) devices stay as they are and
    # no partition overlapping them is offered; Ampere in MIG mode is not offered whole.
    dyn = devices(inv, MigMode.DYNAMIC)
    assert "gpu-0" not in dyn
    assert dyn["gpu-0-mig-3g40gb-4"]["attributes"]["uuid"] == mig["uuid"]
    assert "gpu-0-mig-3g40gb-0" not in dyn  # overlaps the 1g at slice 0
    assert "gpu-0-mig-1g10gb-5" not in dyn  # inside the 3g at 4..7
    assert "gpu-0-mig-1g10gb-1" in dyn


def test_ampere_with_mig_off_gets_no_partitions_in_dynamic_mode() -> None:
    inv = inventory("1xA100-40GB")
    result = build(inv, MigMode.DYNAMIC)
    assert by_index(inv, [d["name"] for s in result.slices for d in s.devices]) == ["gpu-0"]
    assert "cannot switch MIG mode" in result.skipped[0].message


def test_names_and_slices_are_deterministic_across_restarts(tmp_path: Path) -> None:
    first = open_nvml("fake:8xH100-80GB", node="n1", state_dir=tmp_path).discover().inventory
    again = open_nvml("fake:8xH100-80GB", node="n1", state_dir=tmp_path).discover().inventory
    other = open_nvml("fake:8xH100-80GB", node="n2", state_dir=None).discover().inventory
    a, b = build(first, MigMode.DYNAMIC), build(again, MigMode.DYNAMIC)
    assert [s.fingerprint() for s in a.slices] == [s.fingerprint() for s in b.slices]
    assert first.gpus[0].uuid != other.gpus[0].uuid  # UUIDs are per (node, index)


def test_many_devices_are_packed_within_the_limit() -> None:
    base = inventory("1xL4")
    # Named from each UUID (discovery's name for the copied GPU would be one for all).
    gpus = tuple(
        dataclasses.replace(base.gpus[0], index=i, minor=i, uuid=f"GPU-{i:08d}", name="")
        for i in range(300)
    )
    result = build(dataclasses.replace(base, gpus=gpus), MigMode.NONE)
    assert [len(s.devices) for s in result.slices] == [128, 128, 44]
    assert [s.key for s in result.slices] == ["devices-0", "devices-1", "devices-2"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"name": "GPU_0", "attributes": {}}, "not a DNS label"),
        ({"name": "gpu-0", "attributes": {f"a{i}": {"int": i} for i in range(33)}}, "> 32"),
        ({"name": "gpu-0", "attributes": {"productName": {"string": "x" * 65}}}, "longer than 64"),
        ({"name": "gpu-0", "attributes": {"bad-name": {"int": 1}}}, "bad attribute name"),
    ],
)
def test_limit_violations_fail_loudly(bad: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(LimitError, match=message):
        check_limits([SliceContent(key="k", devices=(bad,))])


def test_every_mode_and_fleet_stays_within_the_limits() -> None:
    for spec in ("8xH100-80GB", "8xH200-141GB", "8xA100-40GB:mig=on", "4xA100-80GB+2xL4+2xT4"):
        inv = inventory(spec)
        for mode in MigMode:
            check_limits(build(inv, mode).slices)  # raises on any violation
            for s in build(inv, mode).slices:
                for d in s.devices:
                    assert len(d.get("attributes", {})) + len(d.get("capacity", {})) <= 32


DATA = Path(__file__).resolve().parents[2] / "data"


def test_compute_instances_of_one_gpu_instance_are_devices_of_their_own() -> None:
    """The guide's `-cci 0,0,0` layout once made two devices share a name and the whole
    node publish nothing. Each compute instance is what a claim can be given (CUDA sees
    each as a MIG device): each is published, with a name of its own."""
    inv = inventory(f"@{DATA / 'multi-ci.yaml'}")
    for mode in (MigMode.STATIC, MigMode.DYNAMIC):
        devs = devices(inv, mode)
        cis = sorted(n for n in devs if n.startswith("gpu-0-mig-3g40gb-4"))
        assert cis == [f"gpu-0-mig-3g40gb-4-ci{c}" for c in (0, 1, 2)], mode
        for n in cis:
            attrs = devs[n]["attributes"]
            assert attrs["profile"] == {"string": "1c.3g.40gb"}  # 20 of the 3g's 60 SMs
            assert attrs["uuid"]["string"].startswith("MIG-")
        assert "gpu-0-mig-3g40gb-0" in devs  # the GPU instance with one compute instance
        # A GPU instance without a compute instance is no device...
        assert not any(n.startswith("gpu-1-mig-2g20gb-0") for n in devs)
    # ... but its memory slices are taken: no partition over them, and no whole GPU.
    dyn = devices(inv, MigMode.DYNAMIC)
    assert "gpu-1" not in dyn
    assert "gpu-1-mig-1g10gb-0" not in dyn and "gpu-1-mig-1g10gb-1" not in dyn
    assert "gpu-1-mig-1g10gb-2" in dyn


def test_compute_instances_of_one_gpu_instance_serve_different_claims() -> None:
    inv = inventory(f"@{DATA / 'multi-ci.yaml'}")
    offered = build(inv, MigMode.STATIC).offer.devices()
    gpu = names_of(inv)
    ci0 = offered[real("gpu-0-mig-3g40gb-4-ci0", gpu)]
    ci1 = offered[real("gpu-0-mig-3g40gb-4-ci1", gpu)]
    assert not ci0.overlaps(ci1)  # they share memory by design, not compute
    assert ci0.overlaps(ci0)
    assert not ci0.overlaps(offered[real("gpu-0-mig-3g40gb-0", gpu)])


def test_profile_variants_never_share_a_device_name() -> None:
    from dradriver.inventory.node_devices import profile_token

    names = ["1g.24gb", "1g.24gb+me", "1g.24gb-me", "1g.24gb+me.all", "1g.24gb+gfx", "1g.23gb"]
    tokens = [profile_token(n) for n in names]
    assert len(set(tokens)) == len(tokens)
    assert tokens[:3] == ["1g24gb", "1g24gbme", "1g24gbnome"]
    # Unchanged for the profiles published until now: their device names stay.
    assert profile_token("1g.10gb+me") == "1g10gbme" and profile_token("3g.40gb") == "3g40gb"


def test_one_odd_gpu_is_left_out_and_the_others_are_published() -> None:
    inv = inventory("2xH100-80GB")
    odd = dataclasses.replace(inv.gpus[1], product_name="NVIDIA H100 " + "x" * 64)
    result = build(dataclasses.replace(inv, gpus=(inv.gpus[0], odd)), MigMode.NONE)
    assert by_index(inv, [d["name"] for s in result.slices for d in s.devices]) == ["gpu-0"]
    (skip,) = result.skipped
    assert (skip.uuid, skip.reason) == (odd.uuid, "invalid_devices")
    assert "longer than 64" in skip.message
    # prepare cannot be given it either
    assert list(result.offer.devices()) == [real("gpu-0", names_of(inv))]


def test_spellings_follow_nvidias_software_and_mig_devices_have_no_nvlink_domain() -> None:
    """architecture and brand as go-nvlib spells them (what NVIDIA's DRA driver
    publishes), so a claim written for it selects the same devices here; no NVLink
    domain on MIG devices, which have no peer-to-peer with other GPUs."""
    from dradriver.nvml.discover import BRANDS

    devs = devices(inventory("2xH100-80GB+1xL4"), MigMode.DYNAMIC)
    assert devs["gpu-2"]["attributes"]["architecture"] == {"string": "Ada Lovelace"}
    assert devs["gpu-2"]["attributes"]["brand"] == {"string": "Nvidia"}
    assert (BRANDS[3], BRANDS[5], BRANDS[13]) == ("NVS", "GeForce", "NvidiaRTX")
    assert "nvlinkDomain" in devs["gpu-0"]["attributes"]
    migs = [d for n, d in devs.items() if "-mig-" in n]
    assert migs and not any("nvlinkDomain" in d["attributes"] for d in migs)


@pytest.mark.parametrize("key", list(PRODUCTS), ids=str)
def test_every_product_publishes_in_every_mode(
    key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dradriver devices --devices fake:<product>` in every MIG mode, MIG on and off:
    nothing left out that the mode can give, and in dynamic mode every profile at every
    placement (RTX PRO's +me/-me/+me.all/+gfx variants under names of their own)."""
    import json

    from dradriver.cli import main

    product = PRODUCTS[key]
    specs = [f"2x{key}"] + ([f"2x{key}:mig=on"] if product.mig_capable else [])
    for spec in specs:
        for mode in MigMode:
            rc = main(
                ["devices", "--devices", f"fake:{spec}", "--mig-mode", mode.value, "-o", "json"]
            )
            doc = json.loads(capsys.readouterr().out)
            assert rc == 0
            names = [d["name"] for s in doc["resourceSlices"] for d in s["spec"]["devices"]]
            assert len(names) == len(set(names))
            gpu = fake_names(spec, doc["node"])
            reasons = {k["reason"] for k in doc["skipped"]}
            if mode is MigMode.DYNAMIC and product.mig_capable:
                switchable = product.mig_switch_without_reset
                assert reasons <= (
                    {"not_switchable"} if not switchable and "mig=on" not in spec else set()
                )
                if "not_switchable" not in reasons:
                    for i in range(2):
                        want = {
                            f"{gpu[i]}-mig-{profile_token(p.name)}-{s}"
                            for p in product.gi_profiles
                            for s in p.placement_starts
                        }
                        assert want <= set(names), spec
            elif mode is MigMode.STATIC and "mig=on" in spec:
                assert reasons == {"no_mig_devices"}
            elif mode is MigMode.NONE and "mig=on" in spec:
                assert reasons == {"mig_enabled"}
            else:
                assert reasons == set(), (spec, mode)


@pytest.mark.parametrize(
    ("spec", "domains"),
    [
        ("8xH200-NVL", [4, 4]),  # 4-way bridges
        ("4xH100-NVL", [2, 2]),  # 2-way bridges
        ("2xH200-NVL", [2]),  # too few for a 4-way bridge: a pair
        ("1xH100-NVL", []),  # a lone card has no bridge
        ("4xGB200", [4]),  # one NVL72 clique across the rack
        ("8xB200", [8]),  # HGX board on NVSwitch
        ("2xRTX-PRO-6000+2xL40S", []),
    ],
)
def test_nvlink_wiring_by_product(spec: str, domains: list[int]) -> None:
    from collections import Counter

    inv = inventory(spec)
    sizes = Counter(g.nvlink_domain for g in inv.gpus if g.nvlink_domain)
    assert sorted(sizes.values()) == domains


def test_nvl72_cliques_come_from_the_fabric() -> None:
    """Two nodes of one GB200 NVL72 rack share the fabric's cluster UUID and clique, so
    their GPUs share a domain across nodes; another clique is another domain."""
    a = inventory("4xGB200:cluster=rack-1,clique=3", node="node-a")
    b = inventory("4xGB200:cluster=rack-1,clique=3", node="node-b")
    c = inventory("4xGB200:cluster=rack-1,clique=4", node="node-c")
    (da,) = {g.nvlink_domain for g in a.gpus}
    (db,) = {g.nvlink_domain for g in b.gpus}
    (dc,) = {g.nvlink_domain for g in c.gpus}
    assert da == db != dc
