"""Device names that follow the GPU: the same name for the same GPU whatever NVML's
enumeration does (a GPU gone before a reboot shifts every later index), and a claim never
prepared on another GPU than the one it was allocated."""

from __future__ import annotations

import dataclasses
import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from dradriver.cli import main
from dradriver.errors import DeviceError
from dradriver.inventory.model import Gpu
from dradriver.inventory.naming import GpuIdentity, stable_names
from dradriver.inventory.node_devices import DeviceKind, NodeDevice, mig_device_name
from dradriver.kubeletplugin.prepare.claim_devices import check_identity
from dradriver.kubeletplugin.prepare.preparer import Preparer
from dradriver.kubeletplugin.state.records import ClaimRef
from dradriver.slices.build import DNS_LABEL
from tests.support.gpu_names import fake_names
from tests.support.node import DRIVER, NODE, fake_preparer

FULL = "fake:8xH100-80GB"
GONE = "fake:8xH100-80GB:absent=3"


def _devices(spec: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["devices", "--devices", spec, "--node-name", NODE, "-o", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _published(doc: dict[str, Any]) -> dict[str, str]:
    """UUID -> device name, for the whole GPUs of `dradriver devices -o json`."""
    return {
        d["attributes"]["uuid"]["string"]: d["name"]
        for s in doc["resourceSlices"]
        for d in s["spec"]["devices"]
        if d["attributes"]["type"]["string"] == "gpu"
    }


def test_every_remaining_gpu_keeps_its_name_when_one_is_gone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, gone = _devices(FULL, capsys), _devices(GONE, capsys)
    before, after = _published(full), _published(gone)
    assert len(before) == 8 and len(after) == 7
    assert set(after) < set(before)
    assert all(after[u] == before[u] for u in after)  # same UUID, same name
    gpus = {g["uuid"]: g for g in full["inventory"]["gpus"]}
    for g in gone["inventory"]["gpus"]:
        was = gpus[g["uuid"]]
        assert (g["pciBusId"], g["minor"]) == (was["pciBusId"], was["minor"])
    # NVML's indices shift after the missing GPU: the name of index 3 is another GPU's.
    shifted = {g["index"]: g["uuid"] for g in gone["inventory"]["gpus"]}
    assert shifted[3] == {g["index"]: g["uuid"] for g in full["inventory"]["gpus"]}[4]
    missing = set(before) - set(after)
    assert {gpus[u]["index"] for u in missing} == {3}


def test_names_come_from_the_uuid_and_stay_dns_labels() -> None:
    u = "GPU-9B3C2810-f437-565c-ab0f-914032019dc5"
    assert stable_names([u]) == {u: "gpu-9b3c2810"}
    # Two GPUs that share the first 8 digits: those two, and only they, get longer names.
    twin, other = "GPU-9b3c2810-aaaa-0000-0000-000000000000", "GPU-00000001-0000-0000-0000-0"
    names = stable_names([u, twin, other])
    assert names[u] == "gpu-9b3c2810f437" and names[twin] == "gpu-9b3c2810aaaa"
    assert names[other] == "gpu-00000001"
    same12 = "GPU-9b3c2810-f437-0000-0000-000000000000"
    longest = stable_names([u, same12])[u]
    gpu = Gpu(0, u, 0, "NVIDIA H100", 1, "0000:18:00.0", "9.0.0", "Hopper", "Nvidia", name=longest)
    # The longest name a device can have: a full UUID and the longest profile token.
    worst = mig_device_name(gpu, "1g.24gb+me.all", 6) + "-ci7"
    assert DNS_LABEL.fullmatch(worst) and len(worst) <= 63, worst


def test_the_fakes_uuids_differ_by_product_and_match_the_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100 = _published(_devices("fake:1xH100-80GB", capsys))
    a100 = _published(_devices("fake:1xA100-80GB", capsys))
    assert set(h100).isdisjoint(a100)
    # What a plugin on this node publishes for the same spec: the names its discovery made.
    assert sorted(h100.values()) == sorted(fake_names("1xH100-80GB", NODE))


def _claim(device: str, name: str = "c") -> dict[str, Any]:
    return {
        "metadata": {"uid": str(uuidlib.uuid4()), "namespace": "team", "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device}]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
        },
    }


class Claims(dict[str, dict[str, Any]]):
    def ref(self, name: str, device: str) -> ClaimRef:
        self[name] = _claim(device, name)
        return ClaimRef("team", self[name]["metadata"]["uid"], name)


def _error(driver: Preparer, ref: ClaimRef) -> str:
    return driver.prepare([ref])[ref.uid].error


def test_a_restart_without_one_gpu_keeps_the_names_and_refuses_the_missing_one(
    tmp_path: Path,
) -> None:
    claims = Claims()
    names = fake_names(FULL, NODE)
    driver, _ = fake_preparer(tmp_path, FULL, lambda r: claims[r.name])
    kept = claims.ref("kept", names[5])
    assert driver.prepare([kept])[kept.uid].error == ""
    # The node reboots with GPU 3 gone: NVML's index 3 is the GPU that was index 4.
    driver, _ = fake_preparer(tmp_path, GONE, lambda r: claims[r.name])
    assert fake_names(GONE, NODE) == [*names[:3], *names[4:]]
    again = driver.prepare([kept])[kept.uid]  # the kubelet asks again after its restart
    assert again.error == "" and again.devices[0].device == names[5]
    late = claims.ref("late", names[3])  # allocated to the GPU before it went
    error = _error(driver, late)
    uuid3 = json.loads((tmp_path / "device-names.json").read_text())["names"][names[3]]["uuid"]
    assert f"device {names[3]} is GPU {uuid3} (NVIDIA H100 80GB HBM3, " in error
    assert "which this node does not have now" in error
    assert late.uid not in driver.store.load().claims  # prepared nowhere
    assert not list((tmp_path / "cdi").glob(f"*{late.uid}*"))
    assert driver.unprepare([kept])[kept.uid] == ""


def test_a_name_that_stands_for_another_gpu_now_is_refused_naming_both() -> None:
    gpu_a = Gpu(
        0, "GPU-aaaa", 0, "NVIDIA A100-SXM4-80GB", 1, "0000:18:00.0", "8.0.0", "Ampere", "Nvidia"
    )
    gpu_b = dataclasses.replace(gpu_a, uuid="GPU-bbbb", pci_bus_id="0000:2A:00.0")
    dev = NodeDevice("gpu-x", gpu_b, DeviceKind.GPU)
    ref = ClaimRef("team", "uid-1", "c")
    book = {"gpu-x": GpuIdentity.of(gpu_a)}
    with pytest.raises(DeviceError, match="another GPU than it was allocated") as err:
        check_identity(ref, "gpu-x", dev, name_book=book, devices={dev.name: dev})
    assert "GPU GPU-aaaa (NVIDIA A100-SXM4-80GB, 0000:18:00.0)" in str(err.value)
    assert "GPU GPU-bbbb (NVIDIA A100-SXM4-80GB, 0000:2A:00.0)" in str(err.value)
    assert err.value.reason == "identity_mismatch"
    check_identity(
        ref, "gpu-x", dataclasses.replace(dev, gpu=gpu_a), name_book=book, devices={}
    )  # itself
    # A partition of that name's GPU is checked against the GPU it was published on.
    part = NodeDevice("gpu-x-mig-1g10gb-3", gpu_b, DeviceKind.MIG)
    with pytest.raises(DeviceError, match="another GPU"):
        check_identity(ref, part.name, part, name_book=book, devices={part.name: part})
