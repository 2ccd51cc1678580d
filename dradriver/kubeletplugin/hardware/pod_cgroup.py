"""Where the kubelet keeps a pod's cgroup, found by the pod's UID under either of the
kubelet's cgroup drivers (cgroupfs, systemd) and any --cgroup-root, walking only the
kubelet's tree. The layouts: docs/design.md, "Shares by memory and compute".
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_DEPTH = 4  # root -> [kubelet.slice] -> kubepods -> qos -> pod


def is_pod_dir(name: str, uid: str) -> bool:
    return name == f"pod{uid}" or name.endswith(f"-pod{uid.replace('-', '_')}.slice")


def may_hold_pods(name: str) -> bool:
    return "kubepods" in name or name in ("burstable", "besteffort") or name.startswith("kubelet")


def find_pod_cgroup(root: Path, uid: str) -> Path | None:
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
