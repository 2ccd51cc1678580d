"""RealHost's MPS daemon: the command its pod runs (the driver's own control daemon, in
the foreground, in the driver root) and the tmpfs its /dev/shm is."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dradriver.nvml.host import RealHost


def test_the_daemon_runs_the_drivers_control_daemon_in_the_foreground(tmp_path: Path) -> None:
    pipe, logs, shm = tmp_path / "pipe", tmp_path / "log", tmp_path / "shm"
    cmd = RealHost().mps_daemon(["GPU-a", "GPU-b"], pipe, logs, shm_dir=shm)
    # -f: a container's process must stay (-d forks, and the container would end).
    assert cmd.argv == ("nvidia-cuda-mps-control", "-f")
    assert dict(cmd.env) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
    }
    assert cmd.in_driver_root and cmd.privileged
    # NVIDIA's documentation stops the daemon with `quit` through its pipe directory.
    assert cmd.pre_stop == ("sh", "-c", "echo quit | nvidia-cuda-mps-control")
    v3 = RealHost().mps_daemon(["GPU-a"], pipe, logs, shm_dir=shm, protocol=3)
    assert v3.argv == ("nvidia-cuda-mps-control", "-f", "-p", "3")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_daemons_shm_is_a_sized_tmpfs_anyone_may_write(tmp_path: Path) -> None:
    """Not a directory of the state volume: a tmpfs of the size asked, mode 1777 whatever
    the umask, and gone (unmounted, removed) after drop_tmpfs."""
    shm = tmp_path / "mps" / "claim-0" / "shm"
    host = RealHost()
    old = os.umask(0o022)
    try:
        assert host.make_tmpfs(shm, size=8 << 20, mode=0o1777)
        assert not host.make_tmpfs(shm, size=8 << 20, mode=0o1777)  # idempotent: one mount
    finally:
        os.umask(old)
    try:
        assert os.path.ismount(shm)
        mounts = [m.split() for m in Path("/proc/self/mounts").read_text().splitlines()]
        (mine,) = [m for m in mounts if m[1] == str(shm)]
        assert mine[2] == "tmpfs"
        options = set(mine[3].split(","))
        assert {"size=8192k", "nosuid", "nodev", "noexec"} <= options, options
        assert stat.S_IMODE(shm.stat().st_mode) == 0o1777
    finally:
        host.drop_tmpfs(shm)
    assert not os.path.ismount(shm) and not shm.exists()
