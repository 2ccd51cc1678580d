"""A plugin's prepare stack over one fake machine in dynamic MIG mode, with its state on
disk: claims made, prepared and unprepared by name, and the machine's MIG instances
beside what the checkpoint holds (tests of MIG carving, crash gaps and rollbacks)."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.errors import DriverError
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.prepare.preparer import Preparer
from dradriver.kubeletplugin.state.records import owned_partitions
from fakenvml import FakeNvml
from tests.support.gpu_names import names_of, real
from tests.support.node import DRIVER, NODE, fake_preparer

SPEC = "4xH100-80GB"


@dataclass
class Node:
    """One plugin process's worth of state over one fake machine (state on disk)."""

    tmp: Path
    fake: FakeNvml
    driver: Preparer
    claims: dict[str, dict[str, Any]]
    names: list[str]  # the whole-GPU names, by NVML index, as discovery made them

    def real(self, device: str) -> str:
        """The node's name for `device`, written by NVML index ("gpu-0-mig-3g40gb-4")."""
        return real(device, self.names)

    def instances(self) -> set[tuple[str, int, int]]:
        return {
            (g.uuid, gi.profile.id, gi.start)
            for g in self.fake.machine.gpus
            for gi in g.gpu_instances.values()
        }

    def ref(self, name: str) -> ClaimRef:
        return ClaimRef("team", self.claims[name]["metadata"]["uid"], name)

    def claim(self, name: str, *devices: str) -> ClaimRef:
        self.claims[name] = {
            "metadata": {"uid": str(uuidlib.uuid4()), "namespace": "team", "name": name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": f"r{i}",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": self.real(d),
                            }
                            for i, d in enumerate(devices)
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
            },
        }
        return self.ref(name)

    def prepare(self, ref: ClaimRef) -> list[Any]:
        r = self.driver.prepare([ref])[ref.uid]
        if r.error:
            raise DriverError(r.error)
        return r.devices

    def unprepare(self, ref: ClaimRef) -> None:
        err = self.driver.unprepare([ref])[ref.uid]
        if err:
            raise DriverError(err)

    def checkpoint_owned(self) -> set[tuple[str, int, int]]:
        return owned_partitions(self.driver.store.load())


def start_node(
    tmp: Path,
    claims: dict[str, dict[str, Any]] | None = None,
    boot_id: str = "boot-1",
    spec: str = SPEC,
) -> Node:
    claims = {} if claims is None else claims
    driver, nvml = fake_preparer(tmp, spec, lambda ref: claims[ref.name], boot_id=boot_id)
    return Node(tmp, nvml.backend, driver, claims, names_of(driver.devices()))
