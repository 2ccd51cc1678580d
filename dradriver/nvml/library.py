"""Chooses the NVML library behind the `--devices` flag: the real one (`nvml`), or the
fake C library (`fake:<spec>`) under a private copy of the real pynvml module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver.nvml.discover import Discovery, discover, nvml_session, sysfs_pcie_root
from dradriver.nvml.errors import explain_init_failure


class DevicesSpecError(ValueError):
    pass


@dataclass
class Nvml:
    module: ModuleType  # pynvml, or the fake's private copy of it
    fake: Any | None  # dradriver.nvml.fake.FakeNvml in fake mode
    pcie_root_of: Callable[[str], str | None]

    _initialised: bool = False

    def init(self) -> None:
        """Keeps NVML initialised until the process ends (NVML counts init/shutdown)."""
        if not self._initialised:
            try:
                self.module.nvmlInit()
            except self.module.NVMLError as err:
                raise explain_init_failure(self.module, err) from None
            self._initialised = True

    def discover(self) -> Discovery:
        with nvml_session(self.module):
            return discover(self.module, self.pcie_root_of)


def _fake_pcie_root(bus_id: str) -> str | None:
    # Fake GPUs live in no sysfs; give each PCI bus its own root complex, as the
    # switches of an HGX board do for pairs of GPUs.
    try:
        bus = int(bus_id.split(":")[1], 16)
    except (IndexError, ValueError):
        return None
    return f"pci0000:{bus & 0xC0:02x}"


def open_nvml(devices: str, *, node: str, state_dir: Path | None) -> Nvml:
    """`devices` is `nvml` or `fake:<spec>` (see dradriver.nvml.fake.spec)."""
    if devices == "nvml":
        import pynvml

        return Nvml(pynvml, None, sysfs_pcie_root)
    if devices.startswith("fake:"):
        from dradriver.nvml import fake

        try:
            f = fake.load(devices.removeprefix("fake:"), node=node, state_dir=state_dir)
        except ValueError as exc:
            raise DevicesSpecError(f"--devices {devices!r}: {exc}") from None
        return Nvml(f.pynvml, f, _fake_pcie_root)
    raise DevicesSpecError(
        f"--devices {devices!r}: expected `nvml` (the GPUs of this node) or `fake:<spec>`, "
        "for example fake:8xH100-80GB or fake:4xA100-80GB+2xL4"
    )
