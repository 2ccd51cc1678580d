"""`fake:` device specs: shorthand, options, YAML fleet files, and the errors for bad ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakenvml import FakeSpecError, load, products
from fakenvml.spec import MigDeviceSpec, NvLink, parse


def test_shorthand_with_defaults() -> None:
    spec = parse("fake:8xH100-80GB")
    (group,) = spec.groups
    assert (group.product, group.count, group.nvlink, group.mig) == (
        products.H100_80GB,
        8,
        NvLink.ALL,
        False,
    )
    assert spec.gpu_count == 8


def test_several_groups_and_default_links() -> None:
    spec = parse("4xA100-80GB+2xL4+t4")
    assert [(g.product.key, g.count, g.nvlink) for g in spec.groups] == [
        ("A100-80GB", 4, NvLink.ALL),
        ("L4", 2, NvLink.NONE),
        ("T4", 1, NvLink.NONE),
    ]


def test_options() -> None:
    (group,) = parse("4xA100-80GB:nvlink=pairs,mig=on").groups
    assert group.nvlink is NvLink.PAIRS and group.mig
    (fabric,) = parse("2xH200-141GB:nvlink=fabric,cluster=rack-3,clique=7").groups
    assert (fabric.nvlink, fabric.cluster, fabric.clique) == (NvLink.FABRIC, "rack-3", 7)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty device spec"),
        ("fake:", "empty device spec"),
        ("8xH900", "unknown product 'H900'; known: A100-40GB"),
        ("0xL4", "count must be 1..64"),
        ("65xL4", "count must be 1..64"),
        ("40xL4+40xT4", "80 GPUs in all"),
        ("2xL4:nvlink=pairs", "L4 has no NVLink"),
        ("3xA100-80GB:nvlink=pairs", "nvlink=pairs needs an even GPU count, not 3"),
        ("2xH100-80GB:nvlink=mesh", "nvlink must be none, pairs, quads, all or fabric, not 'mesh'"),
        ("2xT4:mig=on", "T4 does not support MIG"),
        ("2xH100-80GB:mig=yes", "mig must be on or off"),
        ("2xH100-80GB:speed=fast", "unknown option 'speed'"),
        ("2xH100-80GB:mig", "option 'mig' is not key=value"),
        ("2xH100-80GB:mig=on,mig=off", "given twice"),
        ("2xH100-80GB:cluster=a", "cluster and clique need nvlink=fabric"),
        ("2xH100-80GB:nvlink=fabric,clique=x", "clique must be a non-negative integer"),
        ("2xH100-80GB++1xL4", "group 2"),
        ("x", "unknown product 'x'"),
        ("8xH100-80GB:absent=8", "slot 8 is not in 0..7"),
        ("1xH100-80GB:absent=0", "every GPU of the group is absent"),
        ("2xH100-80GB:absent=one", "absent must be a slot number"),
    ],
)
def test_bad_shorthand(spec: str, message: str) -> None:
    with pytest.raises(FakeSpecError) as info:
        parse(spec)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_yaml_fleet(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        """
driverVersion: "550.54.15"
cudaDriverVersion: 12040
gpus:
  - product: a100-80gb
    count: 4
    nvlink: pairs
    mig: on
    migDevices:
      - {gpu: 3, profile: 3g.40gb, placement: 4}
      - {gpu: 3, profile: 4g.40gb, placement: 0}
  - product: H100-80GB
    count: 2
    nvlink: fabric
    cluster: rack-1
    clique: 2
  - product: L4
"""
    )
    spec = parse(f"@{fleet}")
    assert spec.driver_version == "550.54.15" and spec.cuda_driver_version == 12040
    a100, h100, l4 = spec.groups
    assert (a100.count, a100.nvlink, a100.mig) == (4, NvLink.PAIRS, True)
    assert a100.mig_devices == (MigDeviceSpec(3, "3g.40gb", 4), MigDeviceSpec(3, "4g.40gb", 0))
    assert (h100.cluster, h100.clique) == ("rack-1", 2)
    assert (l4.count, l4.nvlink, l4.mig) == (1, NvLink.NONE, False)
    fake = load(f"fake:@{fleet}", node="n", state_dir=None)
    fake.pynvml.nvmlInit()
    assert fake.pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert fake.pynvml.nvmlDeviceGetCount() == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "the document: expected a mapping"),
        ("gpu: []", "unknown field 'gpu'"),
        ("driverVersion: 1", "gpus: required"),
        ("gpus: []", "gpus: must be a non-empty list"),
        ("gpus: [{count: 2}]", "gpus[0].product: required"),
        ("gpus: [{product: H100-80GB, count: two}]", "gpus[0].count: expected an integer"),
        ("gpus: [{product: L4}, {product: MI300X}]", "gpus[1].product: unknown product 'MI300X'"),
        ("gpus: [{product: L4, nvlink: all}]", "gpus[0].nvlink: L4 has no NVLink"),
        ("gpus: [{product: L4, mig: on}]", "gpus[0].mig: L4 does not support MIG"),
        ("gpus: [{product: L4, mig: maybe}]", "gpus[0].mig: expected on or off"),
        ("gpus: [{product: L4, colour: red}]", "gpus[0]: unknown field 'colour'"),
        ("gpus: [{product: H100-80GB, clique: 2}]", "gpus[0].clique: cluster and clique need"),
        ("gpus: [{product: L4}]\ndriverVersion: 570", "driverVersion: expected a string"),
        ("gpus: [{product: L4}]\ncudaDriverVersion: x", "cudaDriverVersion: expected an integer"),
        (
            "gpus: [{product: H100-80GB, migDevices: [{gpu: 0, profile: 7g.80gb, placement: 0}]}]",
            "gpus[0].migDevices: needs mig: on",
        ),
        (
            "gpus: [{product: H100-80GB, mig: on, migDevices: [{gpu: 1, profile: 7g.80gb,"
            " placement: 0}]}]",
            "gpus[0].migDevices[0].gpu: 1 is not in 0..0",
        ),
        (
            "gpus: [{product: H100-80GB, mig: on, migDevices: [{gpu: 0, profile: 3g.20gb,"
            " placement: 0}]}]",
            "gpus[0].migDevices[0].profile: '3g.20gb' is not a H100-80GB profile",
        ),
        (
            "gpus: [{product: H100-80GB, mig: on, migDevices: [{gpu: 0, profile: 3g.40gb,"
            " placement: 2}]}]",
            "gpus[0].migDevices[0].placement: 3g.40gb can start at 0, 4, not 2",
        ),
        (
            "gpus: [{product: H100-80GB, mig: on, migDevices: [{gpu: 0, profile: 3g.40gb}]}]",
            "gpus[0].migDevices[0].placement: required",
        ),
        (
            "gpus: [{product: H100-80GB, mig: on, migDevices: ["
            "{gpu: 0, profile: 4g.40gb, placement: 0}, {gpu: 0, profile: 3g.40gb, placement: 0}]}]",
            "gpus[0].migDevices[1]: does not fit beside the GPU's earlier devices: memory slices",
        ),
        ("gpus: [{product: L4", "not valid YAML"),
    ],
)
def test_bad_yaml(tmp_path: Path, text: str, message: str) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    with pytest.raises(FakeSpecError) as info:
        parse(f"@{fleet}")
    assert message in str(info.value)
    assert str(fleet) in str(info.value)


def test_missing_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(FakeSpecError, match="cannot read the fleet file"):
        parse(f"@{tmp_path}/absent.yaml")


def test_an_absent_gpu_shifts_indices_but_no_identity(tmp_path: Path) -> None:
    from fakenvml.topology import build

    full = build(parse("4xA100-80GB:nvlink=pairs"), "n")
    gone = build(parse("4xA100-80GB:nvlink=pairs,absent=1"), "n")
    assert [g.index for g in gone] == [0, 1, 2]
    assert [(g.uuid, g.minor, g.pci) for g in gone] == [
        (g.uuid, g.minor, g.pci) for g in full if g.minor != 1
    ]
    assert gone[0].links == ()  # its bridge partner is gone
    assert gone[1].links == full[2].links
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("gpus:\n  - {product: L4, count: 3, absent: [0, 2]}\n")
    (only,) = build(parse(f"@{fleet}"), "n")
    assert (only.index, only.minor) == (0, 1)


def test_a_shorthand_spec_may_name_its_driver() -> None:
    """A node on another driver than the default without a fleet file (kind's GB200 trays:
    IMEX channels need 570.158.01)."""
    spec = parse("fake:driver=570.158.01;4xGB200:cluster=rack-7,clique=1")
    assert spec.driver_version == "570.158.01" and spec.gpu_count == 4
    assert parse("4xGB200").driver_version is None
    for bad in ("driver=570;", "driver=abc;4xGB200", "driver=570.1.2 4xGB200"):
        with pytest.raises(FakeSpecError, match="driver=VERSION"):
            parse(bad)
