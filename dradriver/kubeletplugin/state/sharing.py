"""A sharing setup's record: time-slicing or MPS on a claim's device (a GpuConfig's
`sharing`), as the checkpoint keeps it under a prepared device's "sharing"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dradriver.kubeletplugin.state.daemon import DaemonRef
from dradriver.kubeletplugin.state.decode import CheckpointCorrupt, get, obj, optional


@dataclass(frozen=True)
class TimeSlicing:
    interval: str  # Default, Short, Medium, Long
    applied: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"strategy": "TimeSlicing", "interval": self.interval, "applied": self.applied}


@dataclass(frozen=True)
class MpsLimits:
    active_thread_percentage: int | None = None
    pinned_memory_limit: str | None = None  # a Kubernetes quantity, for every device
    per_device_pinned: tuple[tuple[str, str], ...] = ()  # (UUID or index, quantity)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.active_thread_percentage is not None:
            out["activeThreadPercentage"] = self.active_thread_percentage
        if self.pinned_memory_limit is not None:
            out["pinnedMemoryLimit"] = self.pinned_memory_limit
        if self.per_device_pinned:
            out["perDevicePinnedMemoryLimit"] = dict(self.per_device_pinned)
        return out

    @property
    def group(self) -> str:
        """Devices of one claim with the same limits share one daemon."""
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, value: Any, where: str) -> MpsLimits:
        m = obj(value, where)
        per = optional(m, "perDevicePinnedMemoryLimit", dict, default={}, where=where)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in per.items()):
            raise CheckpointCorrupt(f"{where}.perDevicePinnedMemoryLimit: expected strings")
        return cls(
            optional(m, "activeThreadPercentage", int, default=None, where=where),
            optional(m, "pinnedMemoryLimit", str, default=None, where=where),
            tuple(sorted(per.items())),
        )


@dataclass(frozen=True)
class Mps:
    """An MPS control daemon shared by the claim's devices of one limits group (its pod:
    kubeletplugin/daemons/): the directories the claim's containers mount. The compute
    mode it changed is the ledger's (state/ledger.py), written before the change."""

    limits: MpsLimits
    applied: bool = False
    pipe_dir: str | None = None
    log_dir: str | None = None
    shm_dir: str | None = None  # the daemon's and its clients' /dev/shm
    daemon: DaemonRef | None = None

    @property
    def group(self) -> str:
        return self.limits.group

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": "MPS",
            "group": self.group,
            "limits": self.limits.to_json(),
            "applied": self.applied,
        }
        for key, value in (
            ("pipeDir", self.pipe_dir),
            ("logDir", self.log_dir),
            ("shmDir", self.shm_dir),
        ):
            if value is not None:
                out[key] = value
        if self.daemon is not None:
            out["daemon"] = self.daemon.to_json()
        return out


Sharing = TimeSlicing | Mps


def sharing_from_json(value: Any, where: str) -> Sharing:
    s = obj(value, where)
    strategy = get(s, "strategy", str, where=where)
    if strategy == "TimeSlicing":
        return TimeSlicing(
            get(s, "interval", str, where=where),
            optional(s, "applied", bool, default=False, where=where),
        )
    if strategy == "MPS":
        return Mps(
            limits=MpsLimits.from_json(
                optional(s, "limits", dict, default={}, where=where), f"{where}.limits"
            ),
            applied=optional(s, "applied", bool, default=False, where=where),
            pipe_dir=optional(s, "pipeDir", str, default=None, where=where),
            log_dir=optional(s, "logDir", str, default=None, where=where),
            shm_dir=optional(s, "shmDir", str, default=None, where=where),
            daemon=(
                DaemonRef.from_json(s["daemon"], f"{where}.daemon") if s.get("daemon") else None
            ),
        )
    raise CheckpointCorrupt(f"{where}.strategy: unknown sharing strategy {strategy!r}")
