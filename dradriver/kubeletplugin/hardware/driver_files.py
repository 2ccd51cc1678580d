"""The driver's files a container needs (its libraries, commands, GSP firmware and the
hooks that link them and update the container's ld cache), as NVIDIA's container toolkit
computes them (tools/nvcdi's dradriver-nvcdi), asked once per driver version.
See docs/design.md, "CDI specs".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.errors import CdiError
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.driver_files")

HELPER = "dradriver-nvcdi"
HOOK = "nvidia-cdi-hook"
# nvcdi walks a few directories of one driver root: seconds only on a very slow disk.
TIMEOUT = 60.0


class DriverFilesError(CdiError):
    """NVIDIA's toolkit could not say what a container needs of the driver."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="driver_files")


@dataclass
class DriverFiles:
    """`driver_root` as the plugin sees it (the chart mounts it at /driver-root),
    `host_driver_root` as the host and its runtime see it, `hook_path` the host's
    nvidia-cdi-hook (the runtime runs it from the spec)."""

    driver_root: Path
    host_driver_root: Path
    hook_path: str
    helper: str = HELPER
    # Asked under DriverSpec's lock (prepare/driver_spec.py), its one caller: no lock here.
    _cache: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)

    def edits(self, version: str) -> dict[str, Any]:
        """The CDI containerEdits for the driver `version` (as NVML reports it)."""
        known = self._cache.get(version)
        if known is not None:
            return known
        got = self._ask(version)
        self._cache = {version: got}  # the old version's files are gone with it
        log.info(
            "driver files found",
            driver_version=version,
            driver_root=str(self.host_driver_root),
            mounts=len(got.get("mounts") or []),
            hooks=len(got.get("hooks") or []),
        )
        return got

    def _ask(self, version: str) -> dict[str, Any]:
        argv = [
            self.helper,  # found on PATH as subprocess finds any command
            f"--driver-root={self.driver_root}",
            f"--host-driver-root={self.host_driver_root}",
            f"--hook-path={self.hook_path}",
            f"--driver-version={version}",
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        except FileNotFoundError as exc:
            raise DriverFilesError(
                f"CDI layer: {self.helper} (NVIDIA's container toolkit, tools/nvcdi) is not "
                "installed: the image carries it; from a checkout, build it with "
                "`bash tools/nvcdi/build.sh` and put its directory on PATH, or run with "
                "--driver-files runtime"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise DriverFilesError(
                f"CDI layer: {self.helper} did not answer in {TIMEOUT:.0f} s reading the "
                f"driver root {self.driver_root}"
            ) from exc
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or ["no message"]
            raise DriverFilesError(
                f"CDI layer: NVIDIA's container toolkit found no driver {version} under "
                f"{self.driver_root} ({said[0]}): check --driver-root (Helm driverRoot, "
                "/run/nvidia/driver for the GPU Operator's containerised driver)"
            )
        try:
            edits = json.loads(done.stdout)
        except ValueError as exc:
            raise DriverFilesError(f"CDI layer: {self.helper} printed no JSON: {exc}") from exc
        if not isinstance(edits, dict):
            raise DriverFilesError(f"CDI layer: {self.helper} printed {type(edits).__name__}")
        return edits


def install_hook(directory: Path, source: str = HOOK) -> str:
    """The nvidia-cdi-hook this driver carries (on PATH: the image's, built by tools/nvcdi
    from the same toolkit), copied into `directory`, a host path the plugin sees at the same
    path (under the kubelet's plugins/), so that a node without NVIDIA's toolkit still has
    the hook the driver spec names. Returns its path; DriverFilesError when there is none."""
    found = shutil.which(source)
    if found is None:
        raise DriverFilesError(
            f"CDI layer: {source} is not installed here (the image carries it): set "
            "--cdi-hook-path (Helm cdiHookPath) to the node's, e.g. /usr/bin/nvidia-cdi-hook"
        )
    target = directory / HOOK
    data = Path(found).read_bytes()
    try:
        if not target.exists() or target.read_bytes() != data:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{HOOK}.{os.getpid()}"
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            os.replace(tmp, target)  # a runtime running the old one keeps its copy
    except OSError as exc:
        raise DriverFilesError(
            f"CDI layer: cannot install {HOOK} in {directory}: {exc.strerror or exc}"
        ) from exc
    return str(target)
