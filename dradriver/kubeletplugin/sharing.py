"""Sharing a device as its claim's config says: a time-slice interval, or an MPS control
daemon with limits. Applied at prepare, undone exactly at unprepare; the setup is
recorded in the checkpoint (PreparedDevice.extra["sharing"]) before it is made, so a
failed or interrupted prepare leaves no daemon and no changed compute mode behind.
No config, no sharing setup: a device is exclusive unless a config says otherwise.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.api.config import DeviceConfig, quantity_bytes
from dradriver.kubeletplugin.checkpoint import ClaimRecord, PreparedDevice
from dradriver.logs import get_logger
from dradriver.nvml.sharing import Sharing, SharingError, mps_alive

log = get_logger("kubeletplugin.sharing")
KEY = "sharing"


class SharingConfigError(ValueError):
    pass


def plan_device(d: PreparedDevice, cfg: DeviceConfig | None) -> None:
    """Records what sharing setup the device needs (nothing is changed yet)."""
    if cfg is None or cfg.sharing is None:
        return
    s = cfg.sharing
    if s.strategy == "TimeSlicing":
        interval = s.timeSlicingConfig.interval if s.timeSlicingConfig else "Default"
        if d.kind == "mig" and interval != "Default":
            raise SharingConfigError(
                f"device {d.device}: a time-slice interval applies to whole GPUs; MIG devices "
                "are time-sliced by the driver without one (use interval Default, or MPS)"
            )
        d.extra[KEY] = {"strategy": "TimeSlicing", "interval": interval, "applied": False}
        return
    mps = s.mpsConfig
    limits: dict[str, Any] = {}
    if mps is not None:
        if mps.defaultActiveThreadPercentage is not None:
            limits["activeThreadPercentage"] = mps.defaultActiveThreadPercentage
        pinned = dict(mps.defaultPerDevicePinnedMemoryLimit or {})
        if mps.defaultPinnedDeviceMemoryLimit is not None:
            limits["pinnedMemoryLimit"] = mps.defaultPinnedDeviceMemoryLimit
        if pinned:
            limits["perDevicePinnedMemoryLimit"] = pinned
        for q in [limits.get("pinnedMemoryLimit"), *pinned.values()]:
            if q is not None:
                quantity_bytes(q)
    # Devices of one claim with the same MPS config share one daemon.
    d.extra[KEY] = {
        "strategy": "MPS",
        "group": json.dumps(limits, sort_keys=True),
        "limits": limits,
        "applied": False,
    }


@dataclass
class SharingManager:
    sharing: Sharing
    mps_root: Path  # <state dir>/mps: one directory per daemon

    def apply(self, rec: ClaimRecord, save: Any) -> None:
        """Applies every recorded setup of the claim; `save()` persists the checkpoint
        after each change so a crash never loses track of one."""
        for d in rec.devices:
            sh = d.extra.get(KEY)
            if isinstance(sh, dict) and sh["strategy"] == "TimeSlicing" and d.kind == "gpu":
                self.sharing.set_timeslice(str(d.uuid), str(sh["interval"]))
                sh["applied"] = True
                save()
                log.info(
                    "time-slicing applied",
                    claim_uid=rec.uid,
                    device=d.device,
                    interval=sh["interval"],
                )
        for group, devs in self._mps_groups(rec).items():
            self._start_mps(rec, group, devs, save)

    def _mps_groups(self, rec: ClaimRecord) -> dict[str, list[PreparedDevice]]:
        groups: dict[str, list[PreparedDevice]] = {}
        for d in rec.devices:
            sh = d.extra.get(KEY)
            if isinstance(sh, dict) and sh["strategy"] == "MPS":
                groups.setdefault(str(sh["group"]), []).append(d)
        return groups

    def _start_mps(
        self, rec: ClaimRecord, group: str, devs: list[PreparedDevice], save: Any
    ) -> None:
        index = sorted(self._mps_groups(rec)).index(group)
        base = self.mps_root / f"{rec.uid}-{index}"
        pipe, logs = base / "pipe", base / "log"
        for d in devs:
            sh = d.extra[KEY]
            sh.update(pipeDir=str(pipe), logDir=str(logs))
            if d.kind == "gpu":
                # Recorded before it changes, so the undo knows what to restore.
                sh["computeModeBefore"] = self.sharing.compute_mode(str(d.uuid))
        save()
        for d in devs:
            if d.kind == "gpu":
                self.sharing.set_compute_mode(
                    str(d.uuid), self.sharing.nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
                )
                d.extra[KEY]["computeModeSet"] = True
        save()
        pid = self.sharing.start_mps([str(d.uuid) for d in devs], pipe, logs)
        for d in devs:
            d.extra[KEY].update(pid=pid, applied=True)
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
            sh = d.extra.get(KEY)
            if not isinstance(sh, dict):
                continue
            try:
                if sh["strategy"] == "TimeSlicing":
                    if sh.get("applied") and d.kind == "gpu":
                        self.sharing.set_timeslice(str(d.uuid), "Default")
                    continue
                pid = int(sh.get("pid") or 0)
                if pid and pid not in stopped:
                    self.sharing.stop_mps(pid, Path(str(sh.get("pipeDir"))))
                    stopped.add(pid)
                    log.info("MPS control daemon stopped", claim_uid=rec.uid, pid=pid)
                if sh.get("computeModeSet"):
                    self.sharing.set_compute_mode(str(d.uuid), int(sh["computeModeBefore"]))
                if sh.get("pipeDir"):
                    shutil.rmtree(Path(str(sh["pipeDir"])).parent, ignore_errors=True)
            except SharingError as exc:
                errors.append(f"device {d.device}: {exc}")
        if errors:
            raise SharingError("; ".join(errors))

    def recheck(self, rec: ClaimRecord, save: Any) -> None:
        """Startup: a completed claim's MPS daemon must be running (a reboot ends it)."""
        for group, devs in self._mps_groups(rec).items():
            pid = int(devs[0].extra[KEY].get("pid") or 0)
            if not mps_alive(pid):
                log.warning(
                    "MPS control daemon of a prepared claim is gone; starting it again",
                    claim_uid=rec.uid,
                    old_pid=pid,
                )
                self._start_mps(rec, group, devs, save)

    def edits(self, d: PreparedDevice) -> tuple[list[str], list[str]]:
        """(env, mounts) the container needs for the device's sharing setup."""
        sh = d.extra.get(KEY)
        if not isinstance(sh, dict) or sh["strategy"] != "MPS" or not sh.get("pipeDir"):
            return [], []
        env = [f"CUDA_MPS_PIPE_DIRECTORY={sh['pipeDir']}", f"CUDA_MPS_LOG_DIRECTORY={sh['logDir']}"]
        limits = sh.get("limits") or {}
        if "activeThreadPercentage" in limits:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={limits['activeThreadPercentage']}")
        pinned = dict(limits.get("perDevicePinnedMemoryLimit") or {})
        if "pinnedMemoryLimit" in limits:
            pinned.setdefault(str(d.uuid), limits["pinnedMemoryLimit"])
        if pinned:
            env.append(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="
                + ",".join(f"{k}={_mps_quantity(v)}" for k, v in sorted(pinned.items()))
            )
        return env, [str(sh["pipeDir"]), str(sh["logDir"])]


def _mps_quantity(q: str) -> str:
    """MPS wants its limits in M or G: Kubernetes quantities are converted."""
    mib = quantity_bytes(q) // 2**20
    return f"{mib}M"
