"""The claim as the API server returned it, checked against what the kubelet asked for
(pure): the reference, the UID, the allocation, the reservation, the pool; and our
devices in it, each with the configs that apply to its request, in precedence order."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.api.computedomain import CHANNEL_DEVICE
from dradriver.errors import ClaimStateError, DeviceError, RequestError
from dradriver.inventory.naming import GpuIdentity
from dradriver.inventory.node_devices import NodeDevice, gpu_device_name, gpu_name_of
from dradriver.kubeletplugin.state.records import ClaimRef

UID = re.compile(r"[0-9a-fA-F-]{1,64}")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_ref(ref: ClaimRef) -> None:
    """They become file names and API paths, so anything that is not a plain Kubernetes
    name or UID is refused before use."""
    if not ref.uid:
        raise RequestError("request layer: the claim has an empty UID", reason="bad_request")
    if not UID.fullmatch(ref.uid):
        raise RequestError(
            f"request layer: claim UID {ref.uid!r} is not a Kubernetes UID", reason="bad_request"
        )
    for what, v in (("namespace", ref.namespace), ("name", ref.name)):
        if not v or len(v) > 253 or not DNS_SUBDOMAIN.fullmatch(v):
            raise RequestError(
                f"request layer: claim {what} {v!r} is not a valid Kubernetes "
                "name (no slashes, dots at the ends or upper case)",
                reason="bad_request",
            )


@dataclass(frozen=True)
class PlannedDevice:
    request: str  # as in the result, possibly "request/subrequest"
    device: str
    admin_access: bool
    # Opaque config parameters for our driver that apply to this device's request, in
    # precedence order (class configs first, then claim configs; later wins).
    configs: tuple[dict[str, Any], ...] = ()
    # One share of a device that allows multiple allocations: the scheduler's shareID
    # and consumedCapacity (capacity name -> quantity); "" and () for a whole device.
    share_id: str = ""
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def request_name(self) -> str:
        """The kubelet wants request names without the "/subrequest" suffix."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class ClaimDevices:
    """Our devices in an allocated claim, and the pods (UIDs) it is reserved for."""

    devices: list[PlannedDevice]
    pod_uids: tuple[str, ...]


def _applies(cfg_requests: list[str] | None, request: str) -> bool:
    if not cfg_requests:
        return True  # no list: the config applies to every request of the claim
    return request in cfg_requests or request.split("/", 1)[0] in cfg_requests


def claim_devices(claim: dict[str, Any], ref: ClaimRef, driver: str, *, pool: str) -> ClaimDevices:
    """Checks the claim as the API server returned it and lists our devices in it."""
    meta = claim.get("metadata", {})
    if meta.get("uid") != ref.uid:
        raise ClaimStateError(
            f"claim {ref} was replaced: the kubelet asked for UID {ref.uid}, the API server "
            f"has UID {meta.get('uid')}. The pod refers to an older claim; it is retried.",
            reason="claim_replaced",
        )
    status = claim.get("status") or {}
    reserved = status.get("reservedFor") or []
    if meta.get("deletionTimestamp") and not reserved:
        raise ClaimStateError(f"claim {ref} is being deleted", reason="claim_deleted")
    alloc = status.get("allocation")
    if not alloc:
        raise ClaimStateError(
            f"claim {ref} is not allocated: the scheduler has not placed it yet",
            reason="not_allocated",
        )
    if not reserved:
        raise ClaimStateError(
            f"claim {ref} is not reserved for any pod: nothing may use it yet",
            reason="not_reserved",
        )
    devices = alloc.get("devices") or {}
    configs = [
        c for c in devices.get("config") or [] if (c.get("opaque") or {}).get("driver") == driver
    ]
    # The API server keeps class configs before claim configs; sort stably to be sure,
    # since precedence (later wins) depends on it.
    configs.sort(key=lambda c: 0 if c.get("source") == "FromClass" else 1)
    ours: list[PlannedDevice] = []
    for r in devices.get("results") or []:
        if r.get("driver") != driver:
            continue  # another driver's device in the same claim
        if r.get("pool") != pool:
            raise ClaimStateError(
                f"claim {ref}: device {r.get('device')} is in pool "
                f"{r.get('pool')!r}, but this node publishes pool {pool!r}",
                reason="wrong_pool",
            )
        request = str(r.get("request", ""))
        consumed = r.get("consumedCapacity") or {}  # a map of quantities (API validation)
        ours.append(
            PlannedDevice(
                request=request,
                device=str(r.get("device", "")),
                admin_access=bool(r.get("adminAccess")),
                configs=tuple(
                    c["opaque"].get("parameters") or {}
                    for c in configs
                    if _applies(c.get("requests"), request)
                ),
                share_id=str(r.get("shareID") or ""),
                consumed=tuple(sorted((str(k), str(v)) for k, v in consumed.items())),
            )
        )
    if not ours:
        raise ClaimStateError(f"claim {ref} has no device of driver {driver}", reason="not_ours")
    uids = tuple(str(r["uid"]) for r in reserved if r.get("resource") == "pods" and r.get("uid"))
    return ClaimDevices(ours, uids)


_AGAIN = (
    "the claim must be allocated again: delete the pod (a claim from a template is then "
    "made anew) or the claim, and the scheduler picks a device this node publishes now"
)


def check_identity(
    ref: ClaimRef,
    device: str,
    dev: NodeDevice | None,
    *,
    name_book: Mapping[str, GpuIdentity],
    devices: Mapping[str, NodeDevice],
) -> None:
    """Raises DeviceError when `device` is not the GPU it was published for, or that GPU
    is gone; returns for a device this node publishes as what it was. `devices`, what
    the node publishes now, is read only to say what became of a name it no longer has."""
    published = name_book.get(gpu_name_of(device))
    if dev is not None:
        if published is not None and published.uuid != dev.gpu.uuid:
            raise DeviceError(
                f"claim {ref}: device {device} was published for GPU {published.describe()}, "
                f"but that name is GPU {GpuIdentity.of(dev.gpu).describe()} now; the node "
                f"refuses to prepare a claim on another GPU than it was allocated; {_AGAIN}",
                reason="identity_mismatch",
            )
        return
    if published is None:
        why = (
            "is an IMEX channel, which this node does not publish (any more): its GPUs are "
            "not all in one fabric clique, its driver is older than 570.158.01, or the "
            "plugin runs with --imex-channels off"
            if device == CHANNEL_DEVICE
            else "is not published by this node (any more)"
        )
        raise DeviceError(f"claim {ref}: device {device} {why}; {_AGAIN}", reason="not_published")
    now = next((d.gpu for d in devices.values() if d.gpu.uuid == published.uuid), None)
    if now is not None:
        raise DeviceError(
            f"claim {ref}: device {device} was published for GPU {published.describe()}, which "
            f"this node publishes as {gpu_device_name(now)} now (a GPU published in "
            f"another mode); {_AGAIN}",
            reason="renamed",
        )
    raise DeviceError(
        f"claim {ref}: device {device} is GPU {published.describe()}, which this node does not "
        "have now (it fell off the bus, was taken out, or NVML cannot read it: see "
        f"`nvidia-smi` and the plugin's log); {_AGAIN}",
        reason="gpu_gone",
    )
