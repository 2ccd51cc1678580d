"""On real hardware a MIG device needs the /dev/nvidia-caps nodes of its GPU instance
and compute instance, whose minors the driver publishes under /proc."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.kubeletplugin.prepare import cdi
from dradriver.nvml.host import DeviceNode, RealHost
from dradriver.nvml.mig import caps_device_minors
from tests.support.cdi_reference import reference_resolver


def proc_tree(root: Path, minor: int, gi: int, ci: int, gi_minor: int, ci_minor: int) -> None:
    base = root / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True)
    (base / "access").write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\n")
    (base / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\n")


def test_caps_minors_are_read_from_proc(tmp_path: Path) -> None:
    proc_tree(tmp_path, minor=3, gi=2, ci=0, gi_minor=57, ci_minor=58)
    assert caps_device_minors(tmp_path, 3, 2, ci_id=0) == (57, 58)
    with pytest.raises(FileNotFoundError):
        caps_device_minors(tmp_path, 3, 5, ci_id=0)


def test_real_mode_spec_carries_caps_nodes_and_stays_valid(tmp_path: Path) -> None:
    proc_tree(tmp_path / "proc", minor=3, gi=2, ci=0, gi_minor=57, ci_minor=58)
    # The MIG User Guide's examples show majors 238 and 508: it is dynamic, read it.
    (tmp_path / "proc" / "devices").write_text(
        "Character devices:\n195 nvidia\n238 nvidia-caps\n509 nvidia-uvm\n"
    )
    host = RealHost(tmp_path / "proc")
    nodes = host.device_nodes(3, (2, 0))
    assert nodes == [
        DeviceNode("/dev/nvidia3"),
        DeviceNode("/dev/nvidia-caps/nvidia-cap57", "c", 238, 57, 292),
        DeviceNode("/dev/nvidia-caps/nvidia-cap58", "c", 238, 58, 292),
    ]
    spec = cdi.claim_spec(
        "gpu.dradriver.io",
        "0b5e8c3a-1111-2222-3333-444455556666",
        [cdi.CdiDevice(name="gpu-3-mig-1g10gb-0", uuid="MIG-a", device_nodes=nodes)],
        claim_name="team/c",
        control_nodes=host.control_device_nodes(),
    )
    # The runtime makes the caps nodes from their numbers: the host's /dev need not have them.
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3"},
        {
            "path": "/dev/nvidia-caps/nvidia-cap57",
            "type": "c",
            "major": 238,
            "minor": 57,
            "fileMode": 292,
        },
        {
            "path": "/dev/nvidia-caps/nvidia-cap58",
            "type": "c",
            "major": 238,
            "minor": 58,
            "fileMode": 292,
        },
    ]
    assert cdi.cdi_version_for(spec) == "0.3.0"
    writer = cdi.CdiWriter(tmp_path / "cdi", "gpu.dradriver.io")
    writer.write("0b5e8c3a-1111-2222-3333-444455556666", spec)
    assert reference_resolver().validate([tmp_path / "cdi"]) == []
