"""What the binder does for the node's IMEX channel claims (pure): which wait for their
binding conditions, which keep their daemons, and the status entries it writes. When a
claim waits: docs/design.md, "IMEX channels and daemons".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.kubeletplugin.state.records import ClaimRef

Obj = dict[str, Any]


def ref_of(claim: Obj) -> ClaimRef:
    meta = claim.get("metadata") or {}
    return ClaimRef(*(str(meta.get(k, "")) for k in ("namespace", "uid", "name")))


def _channel_entry(entries: list[Obj] | None, driver: str, node: str) -> Obj | None:
    """Of allocation results or status.devices entries, the one of this node's channel."""
    for e in entries or []:
        if (e.get("driver"), e.get("pool"), e.get("device")) == (driver, node, cd.CHANNEL_DEVICE):
            return e
    return None


def channel_result(claim: Obj, driver: str, node: str) -> Obj | None:
    """The allocation result that gives this node's channel device to the claim."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return _channel_entry((alloc.get("devices") or {}).get("results"), driver, node)


@dataclass(frozen=True)
class Waiting:
    ref: ClaimRef
    claim: Obj  # as the API server holds it
    said: Obj | None  # our IMEXDaemonReady condition as the claim has it now


def allocated_here(claims: Iterable[Obj], driver: str, node: str) -> set[str]:
    """UIDs of the claims holding this node's channel: their daemons are kept."""
    return {ref_of(c).uid for c in claims if channel_result(c, driver, node) is not None}


def waiting(claims: Iterable[Obj], driver: str, node: str, *, prepared: set[str]) -> list[Waiting]:
    out = []
    for c in claims:
        r = channel_result(c, driver, node)
        if r is None or cd.BINDING_CONDITION not in (r.get("bindingConditions") or []):
            continue
        ref = ref_of(c)
        if ref.uid in prepared or (c.get("metadata") or {}).get("deletionTimestamp"):
            continue
        # The conditions of the claim's status.devices entry for the channel, by type.
        entry = _channel_entry((c.get("status") or {}).get("devices"), driver, node) or {}
        conds = {str(x.get("type")): x for x in entry.get("conditions") or []}
        done = (cd.BINDING_CONDITION, cd.BINDING_FAILURE)  # the daemon ready, or binding failed
        if any(conds.get(k, {}).get("status") == "True" for k in done):
            continue
        out.append(Waiting(ref, c, conds.get(cd.BINDING_CONDITION)))
    return sorted(out, key=lambda w: (w.ref.namespace, w.ref.name))


def to_sweep(daemons: Mapping[str, Any], keep: set[str]) -> list[str]:
    """Claims whose daemon is on disk but which are neither prepared here nor allocated
    here any more (deallocated after a failed binding, deleted): stopped."""
    return sorted(uid for uid in daemons if uid not in keep)


def condition(kind: str, status: bool, reason: str, *, message: str, now: str) -> Obj:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }


def unchanged(said: Obj | None, new: Obj) -> bool:
    """A False condition written again only when what it says changed."""
    return said is not None and all(said.get(k) == new[k] for k in ("status", "reason", "message"))


def status_body(ref: ClaimRef, driver: str, node: str, *, conds: list[Obj]) -> Obj:
    """A server-side apply of the channel's status.devices entry with these conditions
    (under a field manager of their own: prepare's Ready condition is another's)."""
    entry = {"driver": driver, "pool": node, "device": cd.CHANNEL_DEVICE, "conditions": conds}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "status": {"devices": [entry]},
    }
