"""The hardware side of GPU sharing: time-slice intervals, compute mode and the MPS
control daemon. Real GPUs: nvidia-smi, NVML and nvidia-cuda-mps-control. Fake GPUs: the
interval is recorded in a file, compute mode goes through the fake NVML library, and the
MPS daemon is a real stand-in process (dradriver.nvml.fake.mpsd)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from dradriver.logs import get_logger

log = get_logger("nvml.sharing")
TIMESLICE = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


class SharingError(Exception):
    pass


class Sharing:
    def __init__(self, nvml: ModuleType, fake_record: Path | None = None) -> None:
        """`fake_record`: where fake mode records what real mode would ask nvidia-smi."""
        self.nvml = nvml
        self.fake_record = fake_record

    @property
    def fake(self) -> bool:
        return self.fake_record is not None

    # -- time-slicing ----------------------------------------------------------------------
    def set_timeslice(self, uuid: str, interval: str) -> None:
        value = TIMESLICE[interval]
        if self.fake_record is not None:
            rec = self.recorded()
            rec.setdefault(uuid, {})["timeslice"] = value
            tmp = self.fake_record.with_suffix(".tmp")
            tmp.write_text(json.dumps(rec, sort_keys=True))
            os.replace(tmp, self.fake_record)
            return
        cmd = ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(value)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SharingError(f"{' '.join(cmd)}: {exc}") from None
        if out.returncode != 0:
            raise SharingError(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()}")

    def recorded(self) -> dict[str, dict[str, int]]:
        if self.fake_record is None or not self.fake_record.exists():
            return {}
        data: dict[str, dict[str, int]] = json.loads(self.fake_record.read_text())
        return data

    # -- compute mode ----------------------------------------------------------------------
    def compute_mode(self, uuid: str) -> int:
        try:
            return int(
                self.nvml.nvmlDeviceGetComputeMode(self.nvml.nvmlDeviceGetHandleByUUID(uuid))
            )
        except self.nvml.NVMLError as err:
            raise SharingError(f"reading the compute mode of {uuid}: {err}") from None

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        try:
            self.nvml.nvmlDeviceSetComputeMode(self.nvml.nvmlDeviceGetHandleByUUID(uuid), mode)
        except self.nvml.NVMLError as err:
            raise SharingError(f"setting the compute mode of {uuid}: {err}") from None

    # -- MPS -------------------------------------------------------------------------------
    def start_mps(self, uuids: list[str], pipe_dir: Path, log_dir: Path) -> int:
        """Starts a control daemon in its own session, so it outlives a plugin restart."""
        pipe_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(log_dir),
        }
        if self.fake:
            cmd = [
                sys.executable,
                "-m",
                "dradriver.nvml.fake.mpsd",
                "--pipe-dir",
                str(pipe_dir),
                "--log-dir",
                str(log_dir),
                "--devices",
                ",".join(uuids),
            ]
        else:
            cmd = ["nvidia-cuda-mps-control", "-d"]
        try:
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise SharingError(f"starting the MPS control daemon ({cmd[0]}): {exc}") from None
        control = pipe_dir / "control"
        deadline = time.monotonic() + 10
        while not control.exists():
            if proc.poll() is not None and self.fake:
                raise SharingError(f"the MPS control daemon exited with {proc.returncode}")
            if time.monotonic() > deadline:
                self.stop_mps(proc.pid, pipe_dir)
                raise SharingError(f"the MPS control daemon did not come up in {pipe_dir}")
            time.sleep(0.02)
        return proc.pid

    def stop_mps(self, pid: int, pipe_dir: Path) -> None:
        if not self.fake:
            env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)}
            subprocess.run(
                ["nvidia-cuda-mps-control"],
                input="quit\n",
                text=True,
                env=env,
                capture_output=True,
                timeout=30,
            )
        elif mps_alive(pid):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while mps_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if mps_alive(pid):
            os.kill(pid, signal.SIGKILL)


def mps_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_fake_daemons(root: Path) -> int:
    """Stops every stand-in MPS daemon whose pipe directory lies under `root` (they run in
    their own sessions by design, so tearing down a dev cluster must find them)."""
    stopped = 0
    for control in root.glob("**/pipe/control"):
        try:
            pid = int(control.read_text().strip())
        except (OSError, ValueError):
            continue
        if mps_alive(pid):
            os.kill(pid, signal.SIGTERM)
            stopped += 1
    return stopped
