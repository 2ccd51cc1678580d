"""RealHost's MPS daemon handling, with a stand-in `nvidia-cuda-mps-control` on PATH
that behaves as the real one does with `-d` (fork; the parent exits at once) and `-f`
(stay in the foreground): the PID the driver records must be the daemon's own, and
`quit` through the pipe directory must end it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dradriver.nvml.host import RealHost, mps_alive

STAND_IN = """#!/bin/sh
# -d: daemonize (fork, parent exits); -f: foreground; no argument: read commands.
case "$1" in
  -d) (sh "$0" -f &) ; exit 0 ;;
  -f) echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid"
      : > "$CUDA_MPS_PIPE_DIRECTORY/control"
      [ -e /dev/shm/.bound ] && echo bound > "$CUDA_MPS_PIPE_DIRECTORY/shm-seen"
      exec sleep 300 ;;
  *) read cmd; [ "$cmd" = quit ] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid")" ;;
esac
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --mount needs root")
def test_the_recorded_pid_is_the_daemons_and_quit_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(STAND_IN)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / ".bound").write_text("")
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    host = RealHost()
    pid = host.start_mps(["GPU-x"], pipe, logs, shm_dir=shm)
    try:
        assert int((pipe / "daemon.pid").read_text()) == pid  # the daemon, not a parent
        assert mps_alive(pid)
        # The daemon saw the claim's directory as its /dev/shm.
        assert (pipe / "shm-seen").read_text().strip() == "bound"
        host.stop_mps(pid, pipe)
        assert not mps_alive(pid)
    finally:
        if mps_alive(pid):
            os.kill(pid, 9)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_daemons_shm_is_a_sized_tmpfs_anyone_may_write(tmp_path: Path) -> None:
    """Not a directory of the state volume: a tmpfs of the size asked, mode 1777 whatever
    the umask, and gone (unmounted, removed) after drop_shm."""
    shm = tmp_path / "mps" / "claim-0" / "shm"
    host = RealHost()
    old = os.umask(0o022)
    try:
        host.make_shm(shm, size=8 << 20)
        host.make_shm(shm, size=8 << 20)  # idempotent: one mount
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
        host.drop_shm(shm)
    assert not os.path.ismount(shm) and not shm.exists()
