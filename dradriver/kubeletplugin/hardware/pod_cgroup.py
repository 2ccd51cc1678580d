"""Where the kubelet keeps a pod's cgroup, found by the pod's UID. The kubelet creates it
before it asks for the pod's claims to be prepared (kubelet.go: the pod cgroup is ensured
before SyncPod, and kuberuntime prepares resources before the sandbox), so prepare can
limit it. Both of the kubelet's cgroup drivers are known:

- cgroupfs: `<root>/kubepods[/burstable|/besteffort]/pod<uid>`
- systemd: `<root>/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid with _>.slice`

and a kubelet run with --cgroup-root (kind's nodes: `kubelet.slice/kubelet-kubepods...`)
adds its prefix. The walk enters only directories named for the kubelet's tree, a few
levels deep, so a node's many other cgroups cost nothing.
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
        if not level:
            break
    return None
