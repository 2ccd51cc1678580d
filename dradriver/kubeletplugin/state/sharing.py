"""A sharing setup's record: time-slicing or MPS on a claim's device (a GpuConfig's
`sharing`), as the checkpoint keeps it under a prepared device's "sharing"."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import ClassVar

from dradriver.kubeletplugin.state.daemon import DaemonRef


@dataclass(frozen=True)
class TimeSlicing:
    TAG: ClassVar[str] = "TimeSlicing"
    interval: str  # Default, Short, Medium, Long
    applied: bool = False


@dataclass(frozen=True)
class MpsLimits:
    active_thread_percentage: int | None = None
    pinned_memory_limit: str | None = None  # a Kubernetes quantity, for every device
    # (UUID or index, quantity)
    per_device_pinned: tuple[tuple[str, str], ...] = field(
        default=(), metadata={"key": "perDevicePinnedMemoryLimit"}
    )

    @property
    def group(self) -> str:
        """Devices of one claim with the same limits share one daemon."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Mps:
    """An MPS control daemon shared by the claim's devices of one limits group (its pod:
    kubeletplugin/daemons/): the directories the claim's containers mount. The compute
    mode it changed is the ledger's (state/ledger.py), written before the change."""

    TAG: ClassVar[str] = "MPS"
    limits: MpsLimits = field(metadata={"always": True})
    applied: bool = False
    pipe_dir: str | None = None
    log_dir: str | None = None
    shm_dir: str | None = None  # the daemon's and its clients' /dev/shm
    daemon: DaemonRef | None = None

    @property
    def group(self) -> str:
        return self.limits.group


Sharing = TimeSlicing | Mps
