"""Mistakes at start are one line naming the fix, not a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """Short: the sockets in it must fit a Unix socket path (108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="drk-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path, kubelet_dir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dradriver.cli",
            "kubelet-plugin",
            "--devices",
            "fake:1xL4",
            "--kubeconfig",
            str(tmp_path / "missing.kubeconfig"),
            "--state-dir",
            str(tmp_path / "state"),
            "--kubelet-dir",
            str(kubelet_dir),
            "--healthz-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    (line,) = [x for x in out.splitlines() if "kubeconfig" in x]
    assert "cannot load the kubeconfig: pass --kubeconfig, or run in a pod" in line
    assert "missing.kubeconfig" in line


def test_a_kubelet_dir_too_deep_for_socket_paths_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "dradriver.cli", "kubelet-plugin", "--devices", "fake:1xL4"),
            *("--kubelet-dir", str(deep), "--state-dir", str(tmp_path / "state")),
            *("--healthz-port", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    (line,) = [x for x in out.splitlines() if "level=error" in x]
    assert "longer than a Unix socket path may be (107 bytes)" in line and str(deep) in line


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--consumable-capacity", "memory", "--mig-mode", "dynamic"],
            "--consumable-capacity=memory cannot be combined with --mig-mode=dynamic",
        ),
        (["--consumable-capacity", "shares=99"], "--consumable-capacity=shares=99: N in shares=N"),
    ],
)
def test_consumable_capacity_that_cannot_work_is_refused_naming_the_flags(
    tmp_path: Path, kubelet_dir: Path, args: list[str], says: str
) -> None:
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "dradriver.cli", "kubelet-plugin", "--devices", "fake:1xL4"),
            *("--kubelet-dir", str(kubelet_dir), "--state-dir", str(tmp_path / "state")),
            *("--healthz-port", "0", *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    assert says in out
