"""A daemon a prepared claim depends on, as the pod that runs it (pure): a pod of its own on
the plugin's node, found again by name, whose UID is the daemon's identity, never a PID.
Why a pod: docs/design.md, "Daemons".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from dradriver.kubeletplugin.state.records import DaemonRef as DaemonRef
from dradriver.nvml.host import DaemonCommand

Role = Literal["mps", "imex"]

# Where a daemon pod sees the host's driver root, which it chroots into to run the
# driver's own binary (its libraries and its helpers, such as the MPS server, beside it).
DRIVER_ROOT = "/driver-root"
COMPONENT = "app.kubernetes.io/component"
# What a daemon serves, as its pod's labels: a later plugin finds a forgotten claim's
# daemons by them.
CLAIM = "dradriver.io/claim-uid"
DEVICE = "dradriver.io/device"
DEVICE_NAME = "dradriver.io/device-name"  # the DRA device, for explain (with the node)
DOMAIN = "dradriver.io/computedomain-uid"
LABELS = {"app.kubernetes.io/name": "dradriver", "app.kubernetes.io/managed-by": "kubelet-plugin"}
Labels = tuple[tuple[str, str], ...]  # (label, value)


def component(role: Role) -> str:
    return f"{role}-daemon"


@dataclass(frozen=True)
class DaemonSpec:
    name: str
    role: Role
    serves: Labels  # CLAIM, DEVICE, DOMAIN
    command: DaemonCommand
    dirs: tuple[str, ...] = ()  # host directories it uses, at the same paths
    shm: str | None = None  # the host directory it gets as /dev/shm
    host_network: bool = False  # IMEX: its peers reach it at the node's address


@dataclass(frozen=True)
class PodSite:
    """Where the plugin runs its daemons: its node, its namespace and its image."""

    node: str
    namespace: str
    image: str
    host_driver_root: str = "/"
    node_uid: str = ""  # the Node's, for the pods' ownerReference


def mps_name(claim_uid: str, index: int) -> str:
    """The MPS daemon of a claim's `index`th limits group."""
    return f"mps-{claim_uid}-{index}"


def shares_name(device_uuid: str) -> str:
    """The MPS daemon of a device's shares: GPU and MIG UUIDs are unique across nodes."""
    return "mps-" + "".join(c if c.isalnum() else "-" for c in device_uuid.lower())


def imex_name(domain_uid: str, node: str) -> str:
    """A ComputeDomain's IMEX daemon on one node (node names may be 253 characters)."""
    return f"imex-{domain_uid}-{hashlib.sha256(node.encode()).hexdigest()[:10]}"


def pod_manifest(spec: DaemonSpec, site: PodSite) -> dict[str, Any]:
    """The daemon's pod on `site`'s node: bound to it (no scheduler), tolerating every
    taint (it serves pods already running there), restarted by the kubelet if it exits,
    with no API access, and owned by the Node (drain evicts it; deleting the Node
    collects it)."""
    cmd = spec.command
    root = cmd.in_driver_root
    chroot = ["chroot", DRIVER_ROOT] if root else []
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []

    def host(name: str, path: str, at: str) -> None:
        volumes.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
        mounts.append({"name": name, "mountPath": at})

    if root:
        # Read-write, as the driver's daemon expects its root; the directories below
        # are mounted inside it at their host paths, which the chroot then sees.
        host("driver-root", site.host_driver_root, DRIVER_ROOT)
    for i, d in enumerate(spec.dirs):
        host(f"dir-{i}", d, DRIVER_ROOT + d if root else d)
    if spec.shm is not None:
        host("shm", spec.shm, DRIVER_ROOT + "/dev/shm" if root else "/dev/shm")
        if not root:
            # A stand-in is told its /dev/shm by its host path (the hollow node runs it
            # as a host process, where /dev/shm is the host's): there too.
            mounts.append({"name": "shm", "mountPath": spec.shm})
    security: dict[str, Any] = {"privileged": True}
    if not cmd.privileged:
        security = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,  # the host directories are root's
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    container: dict[str, Any] = {
        "name": component(spec.role),
        "image": site.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [*chroot, *cmd.argv],
        "env": [{"name": k, "value": v} for k, v in cmd.env],
        "securityContext": security,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }
    if cmd.pre_stop:
        container["lifecycle"] = {"preStop": {"exec": {"command": [*chroot, *cmd.pre_stop]}}}
    meta: dict[str, Any] = {
        "name": spec.name,
        "namespace": site.namespace,
        "labels": {**LABELS, COMPONENT: component(spec.role), **dict(spec.serves)},
    }
    if site.node_uid:
        owner = {"apiVersion": "v1", "kind": "Node", "name": site.node, "uid": site.node_uid}
        meta["ownerReferences"] = [{**owner, "controller": True}]
    pod_spec: dict[str, Any] = {
        "nodeName": site.node,
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": volumes,
    }
    if spec.host_network:
        pod_spec["hostNetwork"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}
