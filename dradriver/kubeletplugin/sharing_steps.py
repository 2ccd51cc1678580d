"""The sharing steps of prepare and unprepare: a time-slice interval, or an MPS control
daemon with limits, applied as the claim's record says (plan.py decided it) and undone
exactly. Every change is saved in the record before or right after it is made, so a
failed or interrupted prepare leaves no daemon and no changed compute mode behind.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dradriver.api.config import quantity_bytes
from dradriver.errors import SharingError
from dradriver.kubeletplugin.records import ClaimRecord, Mps, PreparedDevice, TimeSlicing
from dradriver.logs import get_logger
from dradriver.nvml.compute_mode import exclusive_process, get_compute_mode, set_compute_mode
from dradriver.nvml.host import GpuHost, mps_alive

log = get_logger("kubeletplugin.sharing")
Save = Callable[[], None]


def mps_groups(rec: ClaimRecord) -> dict[str, list[PreparedDevice]]:
    """The claim's MPS devices by limits group: one daemon per group."""
    groups: dict[str, list[PreparedDevice]] = {}
    for d in rec.devices:
        if isinstance(d.sharing, Mps):
            groups.setdefault(d.sharing.group, []).append(d)
    return groups


@dataclass
class SharingSteps:
    nvml: ModuleType  # compute mode goes through NVML
    host: GpuHost  # time-slicing and the MPS daemon lie outside it
    mps_root: Path  # <state dir>/mps: one directory per daemon

    def apply(self, rec: ClaimRecord, save: Save) -> None:
        """Applies every sharing setup of the claim; `save()` persists the record after
        each change so a crash never loses track of one."""
        for d in rec.devices:
            sh = d.sharing
            if isinstance(sh, TimeSlicing) and d.kind == "gpu":
                self.host.set_timeslice(str(d.uuid), sh.interval)
                sh.applied = True
                save()
                log.info(
                    "time-slicing applied", claim_uid=rec.uid, device=d.device, interval=sh.interval
                )
        for group, devs in mps_groups(rec).items():
            self._start_mps(rec, group, devs, save)

    def _start_mps(
        self, rec: ClaimRecord, group: str, devs: list[PreparedDevice], save: Save
    ) -> None:
        index = sorted(mps_groups(rec)).index(group)
        base = self.mps_root / f"{rec.uid}-{index}"
        pipe, logs, shm = base / "pipe", base / "log", base / "shm"
        shm.mkdir(parents=True, exist_ok=True, mode=0o1777)
        for d in devs:
            sh = _mps(d)
            sh.pipe_dir, sh.log_dir, sh.shm_dir = str(pipe), str(logs), str(shm)
            if d.kind == "gpu":
                # Recorded before it changes, so the undo knows what to restore.
                sh.compute_mode_before = get_compute_mode(self.nvml, str(d.uuid))
        save()
        for d in devs:
            if d.kind == "gpu":
                set_compute_mode(self.nvml, str(d.uuid), exclusive_process(self.nvml))
                _mps(d).compute_mode_set = True
        save()
        pid = self.host.start_mps([str(d.uuid) for d in devs], pipe, logs, shm)
        for d in devs:
            sh = _mps(d)
            sh.pid, sh.applied = pid, True
        save()
        log.info(
            "MPS control daemon started",
            claim_uid=rec.uid,
            pid=pid,
            devices=",".join(d.device for d in devs),
            pipe_dir=str(pipe),
        )

    def undo(self, rec: ClaimRecord) -> None:
        """Stops daemons, restores compute modes and intervals; idempotent."""
        errors: list[str] = []
        stopped: set[int] = set()
        for d in rec.devices:
            sh = d.sharing
            try:
                if isinstance(sh, TimeSlicing):
                    if sh.applied and d.kind == "gpu":
                        self.host.set_timeslice(str(d.uuid), "Default")
                    continue
                if not isinstance(sh, Mps):
                    continue
                if sh.pid and sh.pid not in stopped:
                    self.host.stop_mps(sh.pid, Path(str(sh.pipe_dir)))
                    stopped.add(sh.pid)
                    log.info("MPS control daemon stopped", claim_uid=rec.uid, pid=sh.pid)
                if sh.compute_mode_set and sh.compute_mode_before is not None:
                    set_compute_mode(self.nvml, str(d.uuid), sh.compute_mode_before)
                if sh.pipe_dir:
                    shutil.rmtree(Path(sh.pipe_dir).parent, ignore_errors=True)
            except SharingError as exc:
                errors.append(f"device {d.device}: {exc}")
        if errors:
            raise SharingError("; ".join(errors), reason="undo")

    def recheck(self, rec: ClaimRecord, save: Save) -> None:
        """Startup: a completed claim's MPS daemon must be running (a reboot ends it)."""
        for group, devs in mps_groups(rec).items():
            pid = _mps(devs[0]).pid or 0
            if not mps_alive(pid):
                log.warning(
                    "MPS control daemon of a prepared claim is gone; starting it again",
                    claim_uid=rec.uid,
                    old_pid=pid,
                )
                self._start_mps(rec, group, devs, save)


def container_edits(d: PreparedDevice) -> tuple[list[str], list[tuple[str, str]]]:
    """(env, mounts as (host path, container path)) a container needs for the device's
    sharing setup (pure). MPS clients share the daemon's pipe and log directories, and
    its /dev/shm, where server and clients exchange memory."""
    sh = d.sharing
    if not isinstance(sh, Mps) or not sh.pipe_dir:
        return [], []
    env = [f"CUDA_MPS_PIPE_DIRECTORY={sh.pipe_dir}", f"CUDA_MPS_LOG_DIRECTORY={sh.log_dir}"]
    limits = sh.limits
    if limits.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={limits.active_thread_percentage}")
    pinned = dict(limits.per_device_pinned)
    if limits.pinned_memory_limit is not None:
        pinned.setdefault(str(d.uuid), limits.pinned_memory_limit)
    if pinned:
        env.append(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="
            + ",".join(f"{k}={_mps_quantity(v)}" for k, v in sorted(pinned.items()))
        )
    mounts = [(str(sh.pipe_dir), str(sh.pipe_dir)), (str(sh.log_dir), str(sh.log_dir))]
    if sh.shm_dir:
        mounts.append((sh.shm_dir, "/dev/shm"))
    return env, mounts


def _mps(d: PreparedDevice) -> Mps:
    assert isinstance(d.sharing, Mps)
    return d.sharing


def _mps_quantity(q: str) -> str:
    """MPS wants its limits in M or G: Kubernetes quantities are converted."""
    mib = quantity_bytes(q) // 2**20
    return f"{mib}M"
