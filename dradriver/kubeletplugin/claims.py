"""Pure checks and planning for one claim: from the ResourceClaim object the API server
returned to the list of devices this node must prepare, or a per-claim error that tells
the user what is wrong. No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

UID = re.compile(r"^[0-9a-fA-F-]{1,64}$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ClaimError(Exception):
    """A per-claim failure: the message goes back to the kubelet and into pod events."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def check_ref(ref: ClaimRef) -> None:
    """The kubelet sends only these three strings; they become file names and API paths,
    so anything that is not a plain Kubernetes name or UID is refused before use."""
    if not ref.uid:
        raise ClaimError("request layer: the claim has an empty UID")
    if not UID.match(ref.uid):
        raise ClaimError(f"request layer: claim UID {ref.uid!r} is not a Kubernetes UID")
    for what, v in (("namespace", ref.namespace), ("name", ref.name)):
        if not v or len(v) > 253 or not DNS_SUBDOMAIN.match(v):
            raise ClaimError(
                f"request layer: claim {what} {v!r} is not a valid Kubernetes "
                "name (no slashes, dots at the ends or upper case)"
            )


@dataclass(frozen=True)
class PlannedDevice:
    request: str  # as in the result, possibly "request/subrequest"
    pool: str
    device: str
    admin_access: bool
    # Opaque config parameters for our driver that apply to this device's request, in
    # precedence order (class configs first, then claim configs; later wins).
    configs: tuple[dict[str, Any], ...] = ()

    @property
    def request_name(self) -> str:
        """The kubelet wants request names without the "/subrequest" suffix."""
        return self.request.split("/", 1)[0]


@dataclass
class Plan:
    ref: ClaimRef
    devices: list[PlannedDevice] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)


def _applies(cfg_requests: list[str] | None, request: str) -> bool:
    if not cfg_requests:
        return True  # no list: the config applies to every request of the claim
    top = request.split("/", 1)[0]
    return request in cfg_requests or top in cfg_requests


def plan(claim: dict[str, Any], ref: ClaimRef, driver: str, pool: str) -> Plan:
    """Checks the claim as the API server returned it and lists our devices in it."""
    meta = claim.get("metadata", {})
    if meta.get("uid") != ref.uid:
        raise ClaimError(
            f"claim {ref} was replaced: the kubelet asked for UID {ref.uid}, the API server "
            f"has UID {meta.get('uid')}. The pod refers to an older claim; it is retried."
        )
    if meta.get("deletionTimestamp") and not (claim.get("status") or {}).get("reservedFor"):
        raise ClaimError(f"claim {ref} is being deleted")
    status = claim.get("status") or {}
    alloc = status.get("allocation")
    if not alloc:
        raise ClaimError(f"claim {ref} is not allocated: the scheduler has not placed it yet")
    reserved = status.get("reservedFor") or []
    if not reserved:
        raise ClaimError(f"claim {ref} is not reserved for any pod: nothing may use it yet")
    devices = alloc.get("devices") or {}
    configs = [
        c for c in devices.get("config") or [] if (c.get("opaque") or {}).get("driver") == driver
    ]
    # The API server keeps class configs before claim configs; sort stably to be sure,
    # since precedence (later wins) depends on it.
    configs.sort(key=lambda c: 0 if c.get("source") == "FromClass" else 1)
    out = Plan(ref=ref, pods=[r.get("name", "") for r in reserved])
    for r in devices.get("results") or []:
        if r.get("driver") != driver:
            continue  # another driver's device in the same claim
        if r.get("pool") != pool:
            raise ClaimError(
                f"claim {ref}: device {r.get('device')} is in pool "
                f"{r.get('pool')!r}, but this node publishes pool {pool!r}"
            )
        request = str(r.get("request", ""))
        out.devices.append(
            PlannedDevice(
                request=request,
                pool=pool,
                device=str(r.get("device", "")),
                admin_access=bool(r.get("adminAccess")),
                configs=tuple(
                    c["opaque"].get("parameters") or {}
                    for c in configs
                    if _applies(c.get("requests"), request)
                ),
            )
        )
    if not out.devices:
        raise ClaimError(f"claim {ref} has no device of driver {driver}")
    return out
