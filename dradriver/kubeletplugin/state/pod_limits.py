"""What each pod's cgroup may hold on each GPU (pure): the memory of every share of that
GPU prepared for a claim reserved for the pod. A pod with two claims sharing one GPU
gets both shares' memory, so preparing the second never shrinks what the first gave.

MIG devices are left out: NVML sets no memory limit on a MIG handle (its memory is its
own already). A share without a memory limit of its own (unlimited mode, asking for
nothing) adds nothing and sets nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from dradriver.kubeletplugin.state.records import ClaimRecord, PreparedDevice


@dataclass(frozen=True)
class PodLimit:
    gpu: str  # UUID
    pod: str  # UID
    memory: int  # bytes: the hard limit, and the soft one (the share's memory is its own)


def limited(d: PreparedDevice) -> bool:
    s = d.share
    held = s is not None and s.memory_limit is not None and bool(s.pods)
    return held and d.kind == "gpu" and bool(d.uuid) and not d.admin_access


def pod_totals(records: Iterable[ClaimRecord]) -> dict[tuple[str, str], int]:
    """(GPU UUID, pod UID) -> the memory of the shares in `records` held for that pod."""
    out: Counter[tuple[str, str]] = Counter()
    for d in (d for rec in records for d in rec.devices if limited(d)):
        assert d.share is not None and d.share.memory_limit is not None and d.uuid
        for pod in d.share.pods:
            out[(d.uuid, pod)] += d.share.memory_limit
    return out


def wanted(rec: ClaimRecord, others: dict[tuple[str, str], int]) -> list[PodLimit]:
    """The limits preparing `rec` sets: for each of its GPUs and pods, its own shares'
    memory and what `others` (pod_totals of the other claims) hold there already."""
    return [
        PodLimit(gpu, pod, memory + others.get((gpu, pod), 0))
        for (gpu, pod), memory in sorted(pod_totals([rec]).items())
    ]
