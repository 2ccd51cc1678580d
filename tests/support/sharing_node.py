"""A plugin's prepare stack over two fake H100s with the stand-in MPS daemon: claims
with a sharing config made and prepared by name, and what the GPUs and daemons hold."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path
from typing import Any

from dradriver.errors import DriverError
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from fakenvml import FakeNvml
from fakenvml.host import FakeHost
from tests.support.gpu_names import names_of, real
from tests.support.local_daemons import LocalDaemons
from tests.support.node import DRIVER, NODE, fake_preparer

V = "gpu.dradriver.io/v1alpha1"


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.claims: dict[str, dict[str, Any]] = {}
        self.driver, nvml = fake_preparer(
            tmp, "2xH100-80GB", lambda ref: self.claims[ref.name], boot_id="boot"
        )
        self.fake: FakeNvml = nvml.backend
        # The whole-GPU names, by NVML index, as discovery made them.
        self.names = names_of(self.driver.devices())
        assert isinstance(nvml.host, FakeHost)
        # What nvidia-smi would have been asked to set (the fake host records it).
        self.sharing = nvml.host
        # The daemons' "pods", as the preparer's own view of them (state in `tmp`).
        self.local = LocalDaemons(tmp)

    def claim(
        self, name: str, device: str, sharing: dict[str, Any] | None, kind: str = "GpuConfig"
    ) -> ClaimRef:
        uid = str(uuidlib.uuid4())
        config = []
        if sharing is not None:
            config = [
                {
                    "source": "FromClaim",
                    "requests": ["r"],
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {"apiVersion": V, "kind": kind, "sharing": sharing},
                    },
                }
            ]
        self.claims[name] = {
            "metadata": {"uid": uid, "namespace": "team", "name": name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "r",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": real(device, self.names),
                            }
                        ],
                        "config": config,
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
            },
        }
        return ClaimRef("team", uid, name)

    def prepare(self, ref: ClaimRef) -> Any:
        r = self.driver.prepare([ref])[ref.uid]
        if r.error:
            raise DriverError(r.error)
        return r.devices

    def spec_env(self, ref: ClaimRef) -> list[str]:
        import json

        spec = json.loads((self.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text())
        return [e for d in spec["devices"] for e in d["containerEdits"]["env"]]

    def mode(self, i: int) -> int:
        return int(self.fake.machine.gpus[i].compute_mode)

    def daemons(self) -> list[str]:
        """The MPS daemons running, by pod name."""
        return self.local.names()
