"""adminAccess (beta, on by default in 1.34): a device given beside the claim that holds
it, for monitoring and diagnostics. Nothing is carved, switched or shared for it, and
releasing it leaves the holding claim untouched."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.prepare.preparer import Preparer
from fakenvml import FakeNvml
from tests.support.gpu_names import names_of, real
from tests.support.node import DRIVER, NODE, fake_preparer

MPS = {
    "apiVersion": "gpu.dradriver.io/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS"},
}


class Node:
    def __init__(self, tmp: Path) -> None:
        self.claims: dict[str, Any] = {}
        self.prep: Preparer
        self.prep, nvml = fake_preparer(tmp, "2xH100-80GB", lambda r: self.claims[r.name])
        self.fake: FakeNvml = nvml.backend
        self.tmp = tmp
        # The whole-GPU names, by NVML index, as discovery made them.
        self.names = names_of(self.prep.devices())

    def claim(self, name: str, device: str, admin: bool = False, config: Any = None) -> ClaimRef:
        uid = str(uuidlib.uuid4())
        result = {
            "request": "r",
            "driver": DRIVER,
            "pool": NODE,
            "device": real(device, self.names),
        }
        if admin:
            result["adminAccess"] = True
        configs = []
        if config:
            configs = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": config}}]
        self.claims[name] = {
            "metadata": {"uid": uid, "namespace": "team", "name": name},
            "status": {
                "allocation": {"devices": {"results": [result], "config": configs}},
                "reservedFor": [{"resource": "pods", "name": name, "uid": "x"}],
            },
        }
        return ClaimRef("team", uid, name)

    def prepare(self, ref: ClaimRef) -> list[Any]:
        r = self.prep.prepare([ref])[ref.uid]
        assert r.error == "", r.error
        return r.devices

    def specs(self) -> list[str]:
        return sorted(p.name for p in (self.tmp / "cdi").glob("*.json"))


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_admin_access_stands_beside_the_holding_claim(node: Node) -> None:
    work = node.claim("work", "gpu-0")
    (held,) = node.prepare(work)
    monitor = node.claim("monitor", "gpu-0", admin=True, config=MPS)
    (seen,) = node.prepare(monitor)  # no "already prepared for claim team/work"
    assert seen.uuid == held.uuid and seen.admin_access and seen.sharing is None
    assert list((node.tmp / "mps").glob("*")) == []  # its MPS config changes nothing
    assert len(node.specs()) == 2
    assert node.prep.unprepare([monitor]) == {monitor.uid: ""}
    # The holding claim is untouched: its record and its CDI spec stay.
    assert list(node.prep.store.load().claims) == [work.uid]
    assert node.specs() == [f"{DRIVER}-claim-{work.uid}.json"]
    # And a plain claim still cannot have a device another claim holds.
    other = node.claim("other", "gpu-0")
    assert "already prepared for claim team/work" in node.prep.prepare([other])[other.uid].error


def test_admin_access_to_a_partition_reaches_the_mig_device_and_carves_nothing(
    node: Node,
) -> None:
    part = "gpu-1-mig-3g40gb-4"
    lonely = node.claim("lonely", part, admin=True)
    error = node.prep.prepare([lonely])[lonely.uid].error
    assert "this MIG partition is not carved" in error
    gpu1 = node.fake.machine.gpus[1]
    assert gpu1.gpu_instances == {} and not gpu1.mig_enabled  # nothing carved, no switch
    work = node.claim("work", part)
    (held,) = node.prepare(work)
    monitor = node.claim("monitor", part, admin=True)
    (seen,) = node.prepare(monitor)
    assert seen.uuid == held.uuid and seen.uuid.startswith("MIG-") and seen.carve is None
    assert len(gpu1.gpu_instances) == 1
    assert node.prep.unprepare([monitor]) == {monitor.uid: ""}
    assert len(gpu1.gpu_instances) == 1  # not destroyed: it is the other claim's
    assert node.prep.unprepare([work]) == {work.uid: ""}
    assert gpu1.gpu_instances == {}


def test_admin_access_to_a_whole_gpu_in_mig_mode_switches_nothing(tmp_path: Path) -> None:
    claims: dict[str, Any] = {}
    prep, nvml = fake_preparer(tmp_path, "1xH100-80GB:mig=on", lambda r: claims[r.name])
    uid = str(uuidlib.uuid4())
    claims["m"] = {
        "metadata": {"uid": uid, "namespace": "team", "name": "m"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": real("gpu-0", names_of(prep.devices())),
                            "adminAccess": True,
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "m", "uid": "x"}],
        },
    }
    ref = ClaimRef("team", uid, "m")
    assert prep.prepare([ref])[ref.uid].error == ""
    assert nvml.backend.machine.gpus[0].mig_enabled  # the admin's view changes nothing
