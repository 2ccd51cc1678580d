"""A share's memory as a kernel-enforced limit on its pods' cgroups (r615+ drivers, whole
GPUs), beside the MPS namespace's limit: best effort, never in MPS's way (probe() says
why, once, at startup); each pod's cgroup found by its UID in the kubelet's tree. See
docs/design.md, "Shares by memory and compute".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dradriver.errors import SharingError
from dradriver.kubeletplugin.state.pod_limits import limited, wanted
from dradriver.kubeletplugin.state.records import ClaimRecord
from dradriver.logs import get_logger
from dradriver.nvml.memory_limits import get_memory_limit, set_memory_limit

log = get_logger("kubeletplugin.pod_memory")
MAX_DEPTH = 4  # root -> [kubelet.slice] -> kubepods -> qos -> pod


@dataclass
class PodMemory:
    nvml: ModuleType
    cgroup_root: Path
    # Why the limits cannot be set on this node; None: they can (or not probed yet).
    unavailable: str | None = None

    def probe(self, gpu: str | None) -> None:
        """Startup: can NVML limit a cgroup on this node? Asks for the limits of the
        cgroup root on one whole GPU; the answer holds for the node."""
        if gpu is None:
            self.unavailable = "no whole GPU on this node (NVML limits no MIG device)"
        elif not (self.cgroup_root / "cgroup.controllers").exists():
            self.unavailable = (
                f"{self.cgroup_root} is not a cgroup v2 mount (--cgroup-root: the host's "
                "unified cgroup hierarchy, mounted from the host)"
            )
        else:
            try:
                get_memory_limit(self.nvml, gpu, str(self.cgroup_root))
                self.unavailable = None
            except SharingError as exc:
                self.unavailable = str(exc)
        if self.unavailable is None:
            log.info(
                "shares' memory is also set as each pod cgroup's GPU-memory limit",
                cgroup_root=str(self.cgroup_root),
            )
        else:
            log.warning(
                "shares' memory cannot be set as a pod cgroup limit here; MPS limits only",
                why=self.unavailable,
            )

    def apply(
        self, rec: ClaimRecord, others: Callable[[], dict[tuple[str, str], int]]
    ) -> ClaimRecord | None:
        """Sets the limits preparing `rec` calls for (`others`: what the other claims'
        shares hold for each GPU and pod, asked only if `rec` has a share to limit). The
        record with, in each share, where they hold; None when that did not change."""
        if self.unavailable is not None or not any(limited(d) for d in rec.devices):
            return None
        found: dict[tuple[str, str], str] = {}
        for lim in wanted(rec, others()):
            cgroup = find_pod_cgroup(self.cgroup_root, lim.pod)
            if cgroup is None:
                log.warning(
                    "the pod's cgroup was not found; its share keeps its MPS limits only",
                    claim_uid=rec.uid,
                    pod_uid=lim.pod,
                    cgroup_root=str(self.cgroup_root),
                )
                continue
            try:
                set_memory_limit(self.nvml, lim.gpu, str(cgroup), soft=lim.memory, hard=lim.memory)
            except SharingError as exc:
                log.warning(
                    "setting the pod cgroup's GPU-memory limit failed; MPS limits only",
                    claim_uid=rec.uid,
                    pod_uid=lim.pod,
                    device=lim.gpu,
                    error=str(exc),
                )
                continue
            found[(lim.gpu, lim.pod)] = str(cgroup)
            log.info(
                "pod cgroup's GPU-memory limit set",
                claim_uid=rec.uid,
                pod_uid=lim.pod,
                device=lim.gpu,
                limit=lim.memory,
                cgroup=str(cgroup),
            )
        out = rec
        for i, d in enumerate(rec.devices):
            if d.share is None or not limited(d):
                continue
            gpu = str(d.uuid)
            cgroups = tuple(found[(gpu, p)] for p in d.share.pods if (gpu, p) in found)
            if cgroups != d.share.pod_cgroups:
                share = dataclasses.replace(d.share, pod_cgroups=cgroups)
                out = out.with_device(i, dataclasses.replace(d, share=share))
        return out if out is not rec else None


def is_pod_dir(name: str, uid: str) -> bool:
    """The cgroup of pod `uid`, under either of the kubelet's cgroup drivers (cgroupfs,
    systemd)."""
    return name == f"pod{uid}" or name.endswith(f"-pod{uid.replace('-', '_')}.slice")


def may_hold_pods(name: str) -> bool:
    """A directory of the kubelet's tree, which may hold pods below it."""
    return "kubepods" in name or name in ("burstable", "besteffort") or name.startswith("kubelet")


def find_pod_cgroup(root: Path, uid: str) -> Path | None:
    """Where the kubelet keeps pod `uid`'s cgroup, under any --cgroup-root, walking only
    the kubelet's tree (the layouts: docs/design.md, "Shares by memory and compute")."""
    level = [root]
    for _ in range(MAX_DEPTH):
        below: list[Path] = []
        for parent in level:
            try:
                entries = list(os.scandir(parent))
            except OSError:
                continue
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    continue
                if is_pod_dir(e.name, uid):
                    return Path(e.path)
                if may_hold_pods(e.name):
                    below.append(Path(e.path))
        level = below
    return None
