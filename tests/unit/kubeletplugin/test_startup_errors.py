"""Mistakes at start are one line naming the fix, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
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
            str(tmp_path / "kubelet"),
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
