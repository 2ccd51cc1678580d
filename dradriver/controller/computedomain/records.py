"""Typed views of what the controller reads: a ComputeDomain, its template, the claims
made from the template (its members), and the facts about the fleet it places them in.
Built from the API server's plain dicts; a field of the wrong shape reads as absent
(the API server checked the schema, but a hand-edited status must not crash a loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.api.config import API_VERSION as CONFIG_API_VERSION

Obj = dict[str, Any]


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Domain:
    namespace: str
    name: str
    uid: str
    generation: int
    num_nodes: int
    template: str  # spec.channel.resourceClaimTemplate.name
    deleting: bool
    finalizers: tuple[str, ...]
    status: Obj

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def clique(self) -> str | None:
        c = self.status.get("clique")
        return c if isinstance(c, str) and c else None

    @property
    def channel(self) -> int | None:
        return _int(self.status.get("channel"))

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Domain:
        meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
        tmpl = _dict(_dict(spec.get("channel")).get("resourceClaimTemplate"))
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=_int(meta.get("generation")) or 0,
            num_nodes=_int(spec.get("numNodes")) or 0,
            template=str(tmpl.get("name", "")),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(str(f) for f in _list(meta.get("finalizers"))),
            status=_dict(obj.get("status")),
        )


@dataclass(frozen=True)
class Template:
    """A ResourceClaimTemplate the controller made (it carries the domain label), or the
    one that sits where a domain wants its own (then `owner` may be anyone's, or None)."""

    namespace: str
    name: str
    uid: str
    owner: str | None  # uid of its controller owner
    domain_uid: str | None  # its domain label
    clique: str | None
    channel: int | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Template:
        meta = _dict(obj.get("metadata"))
        owners = [_dict(o) for o in _list(meta.get("ownerReferences"))]
        owner = next((str(o.get("uid")) for o in owners if o.get("controller") is True), None)
        notes, labels = _dict(meta.get("annotations")), _dict(meta.get("labels"))
        channel = notes.get(cd.CHANNEL_ANNOTATION)
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            owner=owner,
            domain_uid=labels.get(cd.DOMAIN_LABEL),
            clique=notes.get(cd.CLIQUE_ANNOTATION) or None,
            channel=int(channel) if isinstance(channel, str) and channel.isdigit() else None,
        )

    def belongs_to(self, domain: Domain) -> bool:
        return self.owner == domain.uid and self.domain_uid == domain.uid


@dataclass(frozen=True)
class Member:
    """A claim made from a domain's template; `node` once it is allocated."""

    claim: str
    domain_uid: str  # from its opaque config (immutable), not only its label
    node: str | None
    device: str | None
    ready: bool  # the node says the domain's IMEX daemon there is ready
    in_use: bool  # reserved for a pod


def channel_config_uid(claim: Mapping[str, Any], driver: str) -> str | None:
    """The domain uid of the claim's ComputeDomainChannelConfig for `driver`, if any."""
    devices = _dict(_dict(claim.get("spec")).get("devices"))
    for c in _list(devices.get("config")):
        opaque = _dict(_dict(c).get("opaque"))
        params = _dict(opaque.get("parameters"))
        if (
            opaque.get("driver") == driver
            and params.get("apiVersion") == CONFIG_API_VERSION
            and params.get("kind") == "ComputeDomainChannelConfig"
            and isinstance(params.get("domainUID"), str)
        ):
            return str(params["domainUID"])
    return None


def member_of(claim: Mapping[str, Any], driver: str) -> Member | None:
    """The claim as a domain member; None when it has no channel config of ours."""
    uid = channel_config_uid(claim, driver)
    if uid is None:
        return None
    status = _dict(claim.get("status"))
    results = _list(_dict(_dict(status.get("allocation")).get("devices")).get("results"))
    ours = next(
        (
            _dict(r)
            for r in results
            if _dict(r).get("driver") == driver and _dict(r).get("request") == cd.CHANNEL_REQUEST
        ),
        None,
    )
    node = str(ours["pool"]) if ours and ours.get("pool") else None
    device = str(ours["device"]) if ours and ours.get("device") else None
    ready = False
    for d in _list(status.get("devices")):
        d = _dict(d)
        if (d.get("driver"), d.get("pool"), d.get("device")) != (driver, node, device):
            continue
        # Ready from prepare; IMEXDaemonReady from the node before its pod was bound.
        ready = any(
            _dict(c).get("type") in (cd.READY, cd.BINDING_CONDITION)
            and _dict(c).get("status") == "True"
            for c in _list(d.get("conditions"))
        )
    return Member(
        claim=str(_dict(claim.get("metadata")).get("name", "")),
        domain_uid=uid,
        node=node,
        device=device,
        ready=ready and node is not None,
        in_use=bool(_list(status.get("reservedFor"))),
    )


@dataclass(frozen=True)
class Fleet:
    """What placement needs to know about the nodes: each node's fabric clique (from the
    GPUs its ResourceSlices publish), its address, and which domain each node hosts."""

    cliques: Mapping[str, str] = field(default_factory=dict)  # node -> clique
    addresses: Mapping[str, str] = field(default_factory=dict)  # node -> InternalIP
    hosting: Mapping[str, str] = field(default_factory=dict)  # node -> domain uid
    # clique -> channel number -> the uid of the domain placed there that holds it
    channels: Mapping[str, Mapping[int, str]] = field(default_factory=dict)

    def nodes_of(self, clique: str) -> list[str]:
        return sorted(n for n, c in self.cliques.items() if c == clique)

    def taken(self, clique: str, but: str) -> set[int]:
        """Channel numbers of `clique` held by domains other than the one with uid `but`."""
        return {ch for ch, uid in self.channels.get(clique, {}).items() if uid != but}
