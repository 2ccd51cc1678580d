"""The node's driver spec follows the driver: written for the version NVML reports, again
when it changes (an upgrade under a running plugin) or the file is gone (a reboot wipes
/var/run/cdi); a prepare writes it before the claim's spec that names it; the plugin's
hook is installed beside its sockets."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dradriver.kubeletplugin.hardware.driver_files import (
    DriverFiles,
    DriverFilesError,
    install_hook,
)
from dradriver.kubeletplugin.prepare.cdi import CdiWriter
from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec

D = "gpu.dradriver.io"


class Toolkit(DriverFiles):
    """NVIDIA's toolkit's answer, recorded: one libcuda per version (the real helper is
    run over a real layout in test_driver_files.py)."""

    def __init__(self) -> None:
        super().__init__(Path("/driver-root"), Path("/"), "/hook")
        self.asked: list[str] = []

    def _ask(self, version: str) -> dict[str, Any]:
        self.asked.append(version)
        if version == "0.0.0":
            raise DriverFilesError("CDI layer: no driver 0.0.0 under /driver-root")
        lib = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}"
        return {"mounts": [{"hostPath": lib, "containerPath": lib, "options": ["ro"]}]}


def spec_libs(writer: CdiWriter) -> list[str]:
    doc = json.loads(writer.driver_spec_path.read_text())
    return [m["containerPath"] for m in doc["containerEdits"]["mounts"]]


def test_written_once_per_version_and_again_when_gone_or_upgraded(tmp_path: Path) -> None:
    version = ["570.86.15"]
    toolkit, writer = Toolkit(), CdiWriter(tmp_path, D)
    spec = DriverSpec(toolkit, writer, lambda: version[0])
    spec.ensure()
    spec.ensure()
    assert spec_libs(writer) == ["/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15"]
    writer.driver_spec_path.unlink()  # a reboot
    spec.ensure()
    assert writer.driver_spec_path.exists()
    assert toolkit.asked == ["570.86.15"]  # the toolkit's answer is the version's, kept
    version[0] = "580.95.05"  # NVML's string, leading zero and all: the files' names
    spec.ensure()
    assert spec_libs(writer) == ["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"]
    assert toolkit.asked == ["570.86.15", "580.95.05"]


def test_no_version_or_no_driver_is_an_error_a_prepare_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = CdiWriter(tmp_path, D)
    with pytest.raises(DriverFilesError, match="not known yet"):
        DriverSpec(Toolkit(), writer, lambda: "").ensure()
    broken = DriverSpec(Toolkit(), writer, lambda: "0.0.0")
    with pytest.raises(DriverFilesError, match=r"no driver 0\.0\.0"):
        broken.ensure()
    with caplog.at_level(logging.ERROR):
        broken.try_ensure()  # after a discovery: logged, not raised
    (logged,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "no driver 0.0.0" in logged.fields["error"]  # type: ignore[attr-defined]
    assert not writer.driver_spec_path.exists()


def test_the_hook_is_installed_and_replaced_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hook = bin_dir / "nvidia-cdi-hook"
    hook.write_bytes(b"#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    plugins = tmp_path / "kubelet" / "plugins" / D
    path = install_hook(plugins)
    assert path == str(plugins / "nvidia-cdi-hook")
    assert Path(path).read_bytes() == hook.read_bytes()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    inode = os.stat(path).st_ino
    install_hook(plugins)
    assert os.stat(path).st_ino == inode  # the same bytes: left alone
    hook.write_bytes(b"#!/bin/sh\nexit 1\n")  # a new image
    install_hook(plugins)
    assert Path(path).read_bytes() == hook.read_bytes()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DriverFilesError, match="--cdi-hook-path"):
        install_hook(plugins)
