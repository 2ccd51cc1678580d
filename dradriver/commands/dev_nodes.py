"""The registry of a dev cluster's nodes: what `dradriver doctor` needs to check a node
whose kubelet plugin runs as a host process, not a pod (the API server cannot point at
it). The dev tooling (devtools/, `make demo`) writes one file per node,
<cluster dir>/nodes/<node>.json, beside the cluster's kubeconfig; doctor finds them
from the kubeconfig it is given."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

REGISTRY = "nodes"


class RegistryError(ValueError):
    """A registry file that cannot be read; str() names the file."""


@dataclass(frozen=True)
class DevNode:
    node: str
    readyz: str  # URL of the plugin's /readyz
    devices: str  # the plugin's --devices
    mig_mode: str
    cdi_dir: str
    state_dir: str
    kubelet_dir: str
    plugin_log: str


def write(cluster_dir: Path, entry: DevNode) -> Path:
    d = cluster_dir / REGISTRY
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{entry.node}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(entry), indent=1) + "\n")
    tmp.replace(path)  # a doctor reading meanwhile sees the old file or the new one
    return path


def load(cluster_dir: Path) -> list[DevNode]:
    """The registered nodes, by name; none when the directory holds no registry."""
    out = []
    names = {f.name for f in fields(DevNode)}
    for path in sorted((cluster_dir / REGISTRY).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            out.append(DevNode(**{k: str(v) for k, v in doc.items() if k in names}))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise RegistryError(f"dev node registry {path}: {exc}") from exc
    return out


def cluster_dir(kubeconfig: str | None) -> Path | None:
    """The dev cluster of this kubeconfig (--kubeconfig, else $KUBECONFIG): its directory,
    when that holds a node registry."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    if not path or os.pathsep in path:  # a list of kubeconfigs is not a dev cluster's
        return None
    d = Path(path).expanduser().resolve().parent
    return d if any((d / REGISTRY).glob("*.json")) else None
