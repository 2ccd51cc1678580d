"""Chooses the NVML library behind the `--devices` flag: the real one (`nvml`), or the
fake C library (`fake:<spec>`, package fakenvml) under a private copy of the real pynvml
module. This is the only place that knows the fake exists: everything else gets an
`Nvml` with a module to call and a GpuHost for what lies outside NVML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver.nvml.discover import Discovery, discover, nvml_session
from dradriver.nvml.explain import explain_init_failure
from dradriver.nvml.host import GpuHost, RealHost


class DevicesSpecError(ValueError):
    pass


@dataclass
class Nvml:
    module: ModuleType  # pynvml, or the fake's private copy of it
    host: GpuHost
    # The fake node behind `fake:` (fakenvml.FakeNvml), for tests that inject faults;
    # None with real GPUs. The driver itself never looks at it.
    backend: Any = None

    _initialised: bool = False

    def init(self) -> None:
        """Keeps NVML initialised until the process ends (NVML counts init/shutdown)."""
        if not self._initialised:
            try:
                self.module.nvmlInit()
            except self.module.NVMLError as err:
                raise explain_init_failure(self.module, err) from err
            self._initialised = True

    def discover(self) -> Discovery:
        with nvml_session(self.module):
            return discover(self.module, self.host.pcie_root)


def open_nvml(devices: str, *, node: str, state_dir: Path | None, owner: bool = False) -> Nvml:
    """`devices` is `nvml` or `fake:<spec>` (see fakenvml.spec). `owner`: this process
    owns the node's GPUs (the kubelet plugin); a fake node then also takes the faults
    `dradriver dev inject` sends it."""
    if devices == "nvml":
        import pynvml

        return Nvml(pynvml, RealHost())
    if devices.startswith("fake:"):
        try:
            import fakenvml
        except ImportError as exc:
            raise DevicesSpecError(
                f"--devices {devices!r}: the fake NVML backend (package fakenvml) is not "
                "installed; it comes with `pip install dradriver` and the image"
            ) from exc
        try:
            return fakenvml.open_backend(devices.removeprefix("fake:"), node, state_dir, owner)
        except ValueError as exc:
            raise DevicesSpecError(f"--devices {devices!r}: {exc}") from exc
    raise DevicesSpecError(
        f"--devices {devices!r}: expected `nvml` (the GPUs of this node) or `fake:<spec>`, "
        "for example fake:8xH100-80GB or fake:4xA100-80GB+2xL4"
    )
