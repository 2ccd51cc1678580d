"""The node's driver spec (<driver>/driver=files, prepare/cdi.py's driver_spec): what every
GPU container needs of the NVIDIA driver, as NVIDIA's toolkit computes it
(hardware/driver_files.py); one spec for the node, kept for the driver version NVML
reports now. See docs/design.md, "CDI specs".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.errors import CdiError
from dradriver.kubeletplugin.hardware.driver_files import DriverFiles, DriverFilesError
from dradriver.kubeletplugin.prepare import cdi
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.driver_spec")


@dataclass
class DriverSpec:
    files: DriverFiles
    writer: cdi.CdiWriter
    # The driver's version as NVML says it at the latest discovery ("" before the first).
    version: Callable[[], str]
    # The nvidia-cdi-hook the plugin installed for the spec's hooks (None: the node's).
    installed_hook: Path | None = None
    _written: str = field(default="", init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def ensure(self) -> None:
        """The spec for the driver now, written if it is not there. Raises
        DriverFilesError (a CdiError) naming what is missing."""
        version = self.version()
        if not version:
            raise DriverFilesError(
                "CDI layer: the driver's version is not known yet (no device discovery has "
                "succeeded); the kubelet retries"
            )
        with self._lock:
            if version == self._written and self.writer.driver_spec_path.exists():
                return
            edits = self.files.edits(version)
            try:
                spec = cdi.driver_spec(self.writer.driver, version, edits)
            except ValueError as exc:
                raise DriverFilesError(f"CDI layer: {exc}") from exc
            self.writer.write_driver(spec)
            log.info(
                "driver spec written",
                path=str(self.writer.driver_spec_path),
                driver_version=version,
                replaced=self._written or None,
            )
            self._written = version

    def on_node(self) -> list[Path]:
        """What this puts on the node outside the state directory, removed at uninstall
        in this order: the spec, the hook it installed and then the hook's directory (the
        driver's own under the kubelet's plugins/, which the plugin's sockets left)."""
        hook = self.installed_hook
        return [self.writer.driver_spec_path, *([hook, hook.parent] if hook else [])]

    def try_ensure(self) -> None:
        """ensure(), logged instead of raised: after a discovery, where nothing waits on
        it (a prepare asks again and fails with the reason)."""
        try:
            self.ensure()
        except CdiError as exc:
            log.error("driver spec not written", error=str(exc))
