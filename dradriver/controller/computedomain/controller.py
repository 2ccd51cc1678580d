"""The ComputeDomain controller's edge: mirrors of the domains, their templates and
claims (by the domain label) and the driver's ResourceSlices; a loop that, on any
change and every RESYNC seconds, plans each domain (reconcile.py) and applies the plan.

Every write is conditional on the resourceVersion it was planned from (or a create),
so a second replica that slipped past the Lease, or a user's edit, makes a write fail
with a conflict and the next pass plan again; nothing is written twice by accident.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.api.echo import cut
from dradriver.controller.computedomain.placement import node_cliques
from dradriver.controller.computedomain.reconcile import Plan, orphans, reconcile
from dradriver.controller.computedomain.records import Domain, Fleet, Member, Template, member_of
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.k8s.errors import Conflict
from dradriver.k8s.mirror import Mirror
from dradriver.logs import get_logger

log = get_logger("controller.computedomain")

RES = "resource.k8s.io/v1"
RESYNC = 30.0
# A node's address changes rarely (a reboot with DHCP); read again after this long.
ADDRESS_TTL = 60.0
Obj = dict[str, Any]


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_address(node: Obj) -> str | None:
    """The node's IMEX address: its gpu.dradriver.io/imex-address label when that is an
    IP address, else its first InternalIP that is one. Each node's peers write it into
    their IMEX daemon's nodes_config, a line per address: nothing else may get there."""
    meta = node.get("metadata") or {}
    label = (meta.get("labels") or {}).get(cd.IMEX_ADDRESS_LABEL)
    if isinstance(label, str):
        found = cd.ip_address(label)
        if found is not None:
            return found
        log.warning(
            "ignoring a node's IMEX address label: not an IP address",
            node=meta.get("name"),
            label=cd.IMEX_ADDRESS_LABEL,
            value=cut(label),
        )
    addrs = (node.get("status") or {}).get("addresses") or []
    for a in addrs:
        if not isinstance(a, dict) or a.get("type") != "InternalIP":
            continue
        found = cd.ip_address(a.get("address"))
        if found is not None:
            return found
        log.warning(
            "ignoring a node's InternalIP: not an IP address",
            node=meta.get("name"),
            value=cut(str(a.get("address"))),
        )
    return None


class ComputeDomainController:
    def __init__(
        self,
        kube: Kube,
        driver: str,
        device_class: str = cd.CHANNEL_CLASS,
        *,
        clock: Callable[[], str] = utcnow,
    ) -> None:
        self.kube, self.driver, self.clock = kube, driver, clock
        self.device_class = device_class
        self._wake = threading.Event()
        wake = self._wake.set
        self.domains = Mirror(kube, path_for(cd.API_VERSION, cd.PLURAL), wake)
        self.templates = Mirror(
            kube, path_for(RES, "resourceclaimtemplates"), wake, labelSelector=cd.DOMAIN_LABEL
        )
        self.claims = Mirror(
            kube, path_for(RES, "resourceclaims"), wake, labelSelector=cd.DOMAIN_LABEL
        )
        self.slices = Mirror(
            kube, path_for(RES, "resourceslices"), wake, fieldSelector=f"spec.driver={driver}"
        )
        self._addresses: dict[str, tuple[float, str | None]] = {}
        self.passes = 0

    @property
    def mirrors(self) -> list[Mirror]:
        return [self.domains, self.templates, self.claims, self.slices]

    def start(self, stop: threading.Event) -> None:
        """Starts the watches (daemon threads: a watch blocks for a minute at a time)."""
        for m in self.mirrors:
            threading.Thread(
                target=m.run, args=(stop,), name=f"mirror {m.path}", daemon=True
            ).start()

    def run(self, stop: threading.Event, leading: threading.Event | None = None) -> None:
        """Reconciles until `stop`, or until `leading` is cleared (the Lease was lost)."""
        failures = 0
        while not stop.is_set() and (leading is None or leading.is_set()):
            if not all(m.synced.is_set() for m in self.mirrors):
                stop.wait(0.2)
                continue
            self._wake.clear()
            ok = self.sync()
            failures = 0 if ok else failures + 1
            if failures:
                self._wake.wait(min(30.0, 0.5 * 2.0 ** min(failures, 6)))
            else:
                self._wake.wait(RESYNC)
            # Changes come in bursts (a job's claims, a slice per node): take them together.
            stop.wait(0.05)

    def sync(self) -> bool:
        """One pass over every domain; False when a write failed (tried again sooner)."""
        self.passes += 1
        domains = [Domain.of(o) for o in self.domains.items()]
        templates = [Template.of(o) for o in self.templates.items()]
        members = [m for c in self.claims.items() if (m := member_of(c, self.driver))]
        fleet = self._fleet(domains, templates, members)
        by_name = {(t.namespace, t.name): t for t in templates}
        ok = True
        for d in domains:
            try:
                self._one(d, by_name.get((d.namespace, d.template)), members, fleet=fleet)
            except KubeError as exc:
                ok = False
                level = log.info if isinstance(exc, Conflict) else log.warning
                level("reconcile failed; trying again", domain=d.key, error=exc.message or str(exc))
        for t in orphans(templates, {d.uid for d in domains}):
            try:
                self.kube.delete(
                    path_for(RES, "resourceclaimtemplates", t.namespace, name=t.name),
                    missing_ok=True,
                    uid=t.uid or None,
                )
                self.templates.forgot(f"{t.namespace}/{t.name}")
                log.info(
                    "deleted the template of a domain that is gone",
                    template=f"{t.namespace}/{t.name}",
                    domain_uid=t.domain_uid,
                )
            except KubeError as exc:
                ok = False
                log.warning(
                    "deleting an orphaned template failed", template=t.name, error=exc.message
                )
        return ok

    def _fleet(
        self, domains: list[Domain], templates: list[Template], members: list[Member]
    ) -> Fleet:
        channels: dict[str, dict[int, str]] = {}
        for d in domains:
            if d.clique is not None and d.channel is not None:
                channels.setdefault(d.clique, {})[d.channel] = d.uid
        live = {d.uid for d in domains}
        for t in templates:
            if t.domain_uid in live and t.clique is not None and t.channel is not None:
                channels.setdefault(t.clique, {})[t.channel] = t.domain_uid
        nodes = {m.node for m in members if m.node}
        return Fleet(
            cliques=node_cliques(self.slices.items(), self.driver),
            addresses={n: a for n in sorted(nodes) if (a := self._address(n))},
            hosting={m.node: m.domain_uid for m in members if m.node},
            channels=channels,
        )

    def _address(self, node: str) -> str | None:
        """What the node's peers' IMEX daemons connect to (node_address)."""
        now = time.monotonic()
        cached = self._addresses.get(node)
        if cached is not None and now - cached[0] < ADDRESS_TTL:
            return cached[1]
        try:
            obj = self.kube.get(path_for("v1", "nodes", name=node))
        except NotFound:
            addr = None
        except KubeError as exc:
            log.warning("cannot read the node's address", node=node, error=exc.message)
            return cached[1] if cached else None
        else:
            addr = node_address(obj)
        self._addresses[node] = (now, addr)
        return addr

    def _one(
        self, d: Domain, template: Template | None, members: list[Member], *, fleet: Fleet
    ) -> None:
        plan = reconcile(
            d,
            template,
            members,
            fleet=fleet,
            driver=self.driver,
            now=self.clock(),
            device_class=self.device_class,
        )
        if plan.create_template is not None and template is None:
            plan = self._create(d, plan, members, fleet=fleet)
        self._apply(d, plan, template)

    def _create(self, d: Domain, plan: Plan, members: list[Member], *, fleet: Fleet) -> Plan:
        """Adds the finalizer, then makes the template; someone else's template by that
        name turns the plan into one that says so."""
        assert plan.create_template is not None
        if plan.add_finalizer:
            self._finalizers(d, [*d.finalizers, cd.FINALIZER])
            d = Domain.of(self.domains.get(d.key) or {})
        path = path_for(RES, "resourceclaimtemplates", d.namespace)
        try:
            made = self.kube.create(path, plan.create_template)
        except Conflict:  # 409 AlreadyExists: a template we did not make
            found = self.kube.get(
                path_for(RES, "resourceclaimtemplates", d.namespace, name=d.template)
            )
            return reconcile(
                d,
                Template.of(found),
                members,
                fleet=fleet,
                driver=self.driver,
                now=self.clock(),
                device_class=self.device_class,
            )
        self.templates.wrote(made)
        log.info(
            "created the domain's claim template",
            domain=d.key,
            template=d.template,
            clique=plan.create_template["metadata"]["annotations"][cd.CLIQUE_ANNOTATION],
            channel=plan.create_template["metadata"]["annotations"][cd.CHANNEL_ANNOTATION],
        )
        return Plan(status=plan.status)

    def _apply(self, d: Domain, plan: Plan, template: Template | None) -> None:
        if plan.add_finalizer:
            self._finalizers(d, [*d.finalizers, cd.FINALIZER])
        if plan.status is not None:
            self._status(d, plan.status)
        if plan.delete_template:
            self.kube.delete(
                path_for(RES, "resourceclaimtemplates", d.namespace, name=d.template),
                missing_ok=True,
                uid=template.uid if template is not None and template.uid else None,
            )
            self.templates.forgot(f"{d.namespace}/{d.template}")
            log.info("deleted the domain's claim template", domain=d.key, template=d.template)
        if plan.remove_finalizer:
            self._finalizers(d, [f for f in d.finalizers if f != cd.FINALIZER])
            log.info("domain cleaned up; finalizer removed", domain=d.key)

    def _finalizers(self, d: Domain, finalizers: list[str]) -> None:
        obj = self.domains.get(d.key) or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": rv}}
        out = self.kube.patch(path_for(cd.API_VERSION, cd.PLURAL, d.namespace, name=d.name), body)
        self.domains.wrote(out)

    def _status(self, d: Domain, status: Obj) -> None:
        obj = dict(self.domains.get(d.key) or {})
        obj.update(apiVersion=cd.API_VERSION, kind=cd.KIND, status=status)
        out = self.kube.replace(
            path_for(cd.API_VERSION, cd.PLURAL, d.namespace, name=d.name, subresource="status"), obj
        )
        self.domains.wrote(out)
        ready: Obj = next(
            (c for c in status.get("conditions", []) if c.get("type") == cd.READY), {}
        )
        log.info(
            "domain status",
            domain=d.key,
            ready=ready.get("status"),
            reason=ready.get("reason"),
            nodes=",".join(n["name"] for n in status.get("nodes", [])) or None,
        )
