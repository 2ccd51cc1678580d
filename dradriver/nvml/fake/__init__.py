"""A fake NVML at the C-library level: the real pynvml code runs against it unchanged.

    fake = load("8xH100-80GB", node="node-a", state_dir=tmp)
    nvml = fake.pynvml          # a private copy of pynvml, wired to the fake library
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fake.faults.lose_gpu(3)     # and other injected failures; see faults.Faults

Device specs are described in dradriver.nvml.fake.spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dradriver.nvml.fake.clib import FakeNvmlLibrary
from dradriver.nvml.fake.faults import Faults, InitFailure
from dradriver.nvml.fake.machine import FakeMachine, FakeStateError
from dradriver.nvml.fake.module import private_pynvml
from dradriver.nvml.fake.spec import FakeSpecError, parse

__all__ = [
    "FakeMachine",
    "FakeNvml",
    "FakeSpecError",
    "FakeStateError",
    "Faults",
    "InitFailure",
    "load",
]


@dataclass(frozen=True)
class FakeNvml:
    machine: FakeMachine
    library: FakeNvmlLibrary
    pynvml: ModuleType

    @property
    def faults(self) -> Faults:
        return self.machine.faults


def load(
    spec: str,
    *,
    node: str,
    state_dir: Path | None = None,
    driver_version: str | None = None,
    cuda_driver_version: int | None = None,
) -> FakeNvml:
    """A fake node. `spec` is a device spec with or without its `fake:` prefix. With a
    state_dir, MIG state is kept in <state_dir>/fake-nvml-<node>.json and found again by
    the next load() of the same node, as hardware keeps it across a plugin restart.
    Raises FakeSpecError / FakeStateError (both ValueError) with what is wrong."""
    machine = FakeMachine(
        parse(spec),
        node=node,
        state_dir=state_dir,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
    )
    library = FakeNvmlLibrary(machine)
    return FakeNvml(machine, library, private_pynvml(library, node))
