"""One ComputeDomain, reconciled (pure): given it, the template at its template's name,
the claims made from that template and the fleet, what to write. The controller applies
a plan in its field order and stops at the first failure; the next pass plans again
from what the API server then holds, so a restart at any point picks up where it was.

Order and why:
1. the finalizer first, so nothing is made that a deletion could leave behind;
2. the template, once per domain: placed once (placement.py), kept by its annotations;
3. the status, from the members: who joined, on which clique, with what address, ready;
4. on deletion: the template goes, and the finalizer only once no claim of the domain
   is still reserved for a pod (its channel is in use on a node until the pod ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.controller.computedomain.placement import NoRoom, Placement, place
from dradriver.controller.computedomain.records import Domain, Fleet, Member, Template
from dradriver.controller.computedomain.template import template_for

Obj = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    add_finalizer: bool = False
    create_template: Obj | None = None
    delete_template: bool = False
    status: Obj | None = None  # the whole new status; None: unchanged
    remove_finalizer: bool = False

    @property
    def empty(self) -> bool:
        return self == Plan()


def reconcile(
    domain: Domain,
    template: Template | None,
    members: Sequence[Member],
    *,
    fleet: Fleet,
    driver: str,
    now: str,
    device_class: str = cd.CHANNEL_CLASS,
) -> Plan:
    members = [m for m in members if m.domain_uid == domain.uid]
    ours = template is not None and template.belongs_to(domain)
    if domain.deleting:
        return _deleting(domain, ours, members, now=now)
    add = cd.FINALIZER not in domain.finalizers
    if template is not None and not ours:
        cond = _condition(
            "False",
            "TemplateExists",
            f"ResourceClaimTemplate {domain.namespace}/{domain.template} already exists and "
            "is not this ComputeDomain's: name another in spec.channel.resourceClaimTemplate "
            "(delete and create the domain again; its spec is immutable)",
        )
        return Plan(
            add_finalizer=add,
            status=_changed(domain, _status(domain, None, [], fleet=fleet, ready=cond), now),
        )
    create = None
    placement: Placement | NoRoom
    if ours:
        assert template is not None
        placement = _kept(domain, template, fleet)
    else:
        placement = _again(domain, fleet) or place(domain, fleet)
        if isinstance(placement, Placement):
            create = template_for(domain, placement, driver, device_class=device_class)
    if isinstance(placement, NoRoom):
        cond = _condition("False", placement.reason, placement.message)
        status = _status(domain, None, members, fleet=fleet, ready=cond)
    else:
        status = _status(
            domain,
            placement,
            members,
            fleet=fleet,
            ready=_readiness(domain, placement, members, fleet=fleet),
        )
    return Plan(add_finalizer=add, create_template=create, status=_changed(domain, status, now))


def _deleting(domain: Domain, ours: bool, members: Sequence[Member], *, now: str) -> Plan:
    if cd.FINALIZER not in domain.finalizers:
        return Plan()
    held = sorted(m.claim for m in members if m.in_use)
    if not held:
        return Plan(delete_template=ours, remove_finalizer=True)
    cond = _condition(
        "False",
        "Deleting",
        f"deleting: waiting for {len(held)} claim(s) still reserved for pods of the job "
        f"({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}); delete the job's pods",
    )
    status = dict(domain.status)
    status["conditions"] = [cond]
    return Plan(delete_template=ours, status=_changed(domain, status, now))


def _kept(domain: Domain, template: Template, fleet: Fleet) -> Placement | NoRoom:
    """The placement the existing template was made with."""
    if template.clique is None or template.channel is None:
        return NoRoom(
            "TemplateUnreadable",
            f"ResourceClaimTemplate {domain.namespace}/{domain.template} lost its "
            f"{cd.CLIQUE_ANNOTATION} or {cd.CHANNEL_ANNOTATION} annotation; delete the "
            "template and the controller makes it again",
        )
    return Placement(template.clique, template.channel)


def _again(domain: Domain, fleet: Fleet) -> Placement | None:
    """The placement the status recorded, for a template deleted since (by hand, or a
    crash between the two writes): kept while no other domain took its channel."""
    clique, channel = domain.clique, domain.channel
    if clique is None or channel is None or channel in fleet.taken(clique, domain.uid):
        return None
    return Placement(clique, channel)


def _readiness(
    domain: Domain, placement: Placement, members: Sequence[Member], *, fleet: Fleet
) -> Obj:
    joined = sorted(m.node for m in members if m.node)
    ready = sorted(
        m.node
        for m in members
        if m.node and m.ready and fleet.cliques.get(m.node) == placement.clique
    )
    n = domain.num_nodes
    if len(ready) >= n:
        return _condition(
            "True", "NodesReady", f"{len(ready)} of {n} nodes ready: {', '.join(ready)}"
        )
    if not joined:
        return _condition(
            "False",
            "WaitingForPods",
            f"no pod of the job has been scheduled yet (0 of {n} nodes); the job's pods "
            f"name ResourceClaimTemplate {domain.template} in spec.resourceClaims",
        )
    waiting = [j for j in joined if j not in ready]
    return _condition(
        "False",
        "WaitingForNodes",
        f"{len(ready)} of {n} nodes ready; joined: {', '.join(joined)}"
        + (f"; IMEX daemon not ready yet on {', '.join(waiting)}" if waiting else ""),
    )


def _status(
    domain: Domain,
    placement: Placement | None,
    members: Sequence[Member],
    *,
    fleet: Fleet,
    ready: Obj,
) -> Obj:
    status: Obj = {}
    if placement is not None:
        status["clique"], status["channel"] = placement.clique, placement.channel
    nodes = []
    for m in sorted((m for m in members if m.node), key=lambda m: m.node or ""):
        assert m.node is not None
        entry: Obj = {"name": m.node, "ready": m.ready, "claim": m.claim}
        if m.node in fleet.cliques:
            entry["clique"] = fleet.cliques[m.node]
        if m.node in fleet.addresses:
            entry["address"] = fleet.addresses[m.node]
        nodes.append(entry)
    if nodes:
        status["nodes"] = nodes
    status["conditions"] = [dict(ready, observedGeneration=domain.generation)]
    return status


def _condition(status: str, reason: str, message: str) -> Obj:
    return {"type": cd.READY, "status": status, "reason": reason, "message": message}


def _changed(domain: Domain, status: Obj, now: str) -> Obj | None:
    """`status` with each condition's lastTransitionTime (kept while its status holds),
    or None when it is what the domain already has."""
    before = {
        c.get("type"): c for c in domain.status.get("conditions") or [] if isinstance(c, dict)
    }
    conds = []
    for c in status.get("conditions", []):
        old = before.get(c["type"]) or {}
        since = old.get("lastTransitionTime") if old.get("status") == c["status"] else None
        conds.append(dict(c, lastTransitionTime=since or now))
    status = dict(status, conditions=conds)
    return None if status == domain.status else status


def orphans(templates: Sequence[Template], domain_uids: set[str]) -> list[Template]:
    """Templates the controller made for domains that are gone (deleted while it was not
    running and its finalizer taken off by hand): the garbage collector would delete
    them through their owner reference, where one runs."""
    return [t for t in templates if t.domain_uid and t.domain_uid not in domain_uids]
