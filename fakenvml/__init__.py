"""A fake NVML at the C-library level: the real pynvml code runs against it unchanged.
It is the `--devices fake:<spec>` backend of dradriver (chosen in
dradriver.nvml.library, its only entry point from the driver) and the test bench's GPUs;
every hardware fact it follows (products.py, mig_rules.py) cites its public source.

    fake = load("8xH100-80GB", node="node-a", state_dir=tmp)
    nvml = fake.pynvml          # a private copy of pynvml, wired to the fake library
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fake.faults.lose_gpu(3)     # and other injected failures; see faults.Faults

Device specs are described in fakenvml.spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from fakenvml.clib import FakeNvmlLibrary
from fakenvml.faults import Faults, InitFailure
from fakenvml.machine import FakeMachine, FakeStateError
from fakenvml.module import private_pynvml
from fakenvml.spec import FakeSpecError, parse

if TYPE_CHECKING:
    from dradriver.nvml.library import Nvml

__all__ = [
    "FakeMachine",
    "FakeNvml",
    "FakeSpecError",
    "FakeStateError",
    "Faults",
    "InitFailure",
    "load",
    "open_backend",
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


def open_backend(spec: str, node: str, state_dir: Path | None, owner: bool = False) -> Nvml:
    """The driver's NVML backend for `--devices fake:<spec>`: the fake library and the
    fake GpuHost (fakenvml.host), with state kept under state_dir. The `owner` (the
    kubelet plugin, one per node) also applies the faults `dradriver dev inject` sends
    through the state directory (fakenvml.inject)."""
    from dradriver.nvml.library import Nvml
    from fakenvml.host import FakeHost

    fake = load(spec, node=node, state_dir=state_dir)
    if owner and state_dir is not None:
        from fakenvml.inject import Watcher, requests_dir

        Watcher(fake.machine, requests_dir(state_dir, node)).start()
    record = (state_dir or Path(".")) / f"fake-sharing-{node}.json"
    return Nvml(fake.pynvml, FakeHost(record), backend=fake)
