"""`dradriver explain`, the pure part: each request of each claim walked through the
steps the scheduler takes (published, class, selectors, count, free, counters, node), with
the first step that fails said in one line, with its layer and its fix."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dradriver.api.suggest import did_you_mean
from dradriver.diagnose import imex
from dradriver.diagnose.capacity import Fit, fit, requested
from dradriver.diagnose.cel import CompileError, Selector
from dradriver.diagnose.nearest import MissingName, explain_miss, missing_name
from dradriver.diagnose.nodes import refusal
from dradriver.diagnose.shares import miss_text, share_lines
from dradriver.diagnose.world import (
    Published,
    World,
    blocked_by_counters,
    remaining_counters,
)

Obj = Mapping[str, Any]
PARTITIONS_GATE = "DRAPartitionableDevices"


@dataclass(frozen=True)
class Finding:
    layer: str
    message: str
    fix: str = ""

    def line(self) -> str:
        fix = f" Fix: {self.fix}" if self.fix else ""
        message = self.message.rstrip(" .")
        end = "" if message.endswith("?") else "."  # "did you mean X?" ends the sentence
        return f"{self.layer}: {message}{end}{fix}"


@dataclass
class NodeRow:
    node: str
    published: int = 0
    in_class: int = 0
    matching: int = 0
    taken: int = 0
    counters: int = 0
    tainted: int = 0  # a device taint the request does not tolerate
    short: int = 0  # its capacity (or what its shares leave of it) is too small
    free: int = 0
    usable: int = 0  # free and within a matchAttribute group
    refused: str = ""  # why the pod may not go there (cordon, taint, selector)


@dataclass
class RequestReport:
    claim: str
    request: str
    device_class: str
    count: str
    rows: list[NodeRow] = field(default_factory=list)
    finding: Finding | None = None
    fits_on: list[str] = field(default_factory=list)
    shares: list[str] = field(default_factory=list)  # each shared device that matched


@dataclass
class Report:
    target: str
    requests: list[RequestReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finding: Finding | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["finding"] = self.finding.line() if self.finding else None
        for r, rr in zip(d["requests"], self.requests, strict=True):
            r["finding"] = rr.finding.line() if rr.finding else None
        return d


@dataclass(frozen=True)
class ClaimRef:
    """A claim of the pod (or the claim asked about): the object, or why there is none."""

    name: str  # namespace/name, or the pod's claim entry when there is no object
    obj: Obj | None
    missing: Finding | None = None  # why there is no object (diagnose.missing)


def _selectors(obj: Obj) -> list[str]:
    return [s["cel"]["expression"] for s in obj.get("selectors") or [] if "cel" in s]


def _compile(exprs: Sequence[str]) -> tuple[list[Selector], str]:
    out = []
    for e in exprs:
        try:
            out.append(Selector(e))
        except CompileError as exc:
            return [], f"`{e}`: {exc}"
    return out, ""


def _nodes_of(d: Published, w: World) -> list[str]:
    return [d.node] if d.node else sorted(w.nodes)


def _count_text(req: Obj) -> str:
    if req.get("allocationMode") == "All":
        return "all"
    return str(int(req.get("count", 1)))


def _filter(
    sels: Sequence[Selector], devices: Sequence[Published], who: str, *, w: World
) -> tuple[list[Published], Finding | None]:
    """The devices every selector accepts, or the CEL runtime error the scheduler stops at."""
    out = []
    for d in devices:
        ok = True
        for i, sel in enumerate(sels):
            o = sel.evaluate(d.cel)
            if o.error:
                errors = sum(1 for x in devices if sel.evaluate(x.cel).error)
                message = (
                    f"{who} selector #{i} fails with a CEL runtime error on {errors} of "
                    f"{len(devices)} devices (first: {d.name} in pool {d.pool}: {o.error}), "
                    "and the scheduler gives up on the pod at the first error"
                )
                miss = missing_name(sel.expression, o.error, w.devices)
                return [], _runtime_error(message, miss, len(w.devices))
            if not o.matches:
                ok = False
                break
        if ok:
            out.append(d)
    return out, None


_GUARD = (
    "guard attributes some devices lack with has(...) (e.g. "
    'has(device.attributes["gpu.dradriver.io"].x) && ...), or fix the attribute name'
)


def _runtime_error(message: str, miss: MissingName | None, published: int) -> Finding:
    """A selector's CEL runtime error, with the published name it most likely meant when
    it reads one that no device has (a typo, not a name some devices lack)."""
    if miss is None:
        return Finding("selector", message, _GUARD)
    if miss.holders:
        return Finding(
            "selector",
            f"{message}; {miss.holders} of {published} published devices have {miss.what}",
            _GUARD,
        )
    if miss.suggestion:
        return Finding(
            "selector",
            f"{message}; no published device has {miss.what}: did you mean {miss.suggestion}?",
            f"correct the name in the selector to {miss.suggestion}",
        )
    listed = (
        f"{miss.domain} publishes {miss.kind} {miss.names()}"
        if miss.published
        else f"no device publishes {miss.kind} under {miss.domain}"
    )
    return Finding(
        "selector", f"{message}; no published device has {miss.what}", f"{_GUARD} ({listed})"
    )


def _group_max(devices: Sequence[Published], attribute: str) -> int:
    """The largest set of devices sharing one value of a matchAttribute constraint."""
    domain, _, name = attribute.rpartition("/")
    groups: dict[object, int] = defaultdict(int)
    for d in devices:
        value = d.cel.attributes.get(domain or d.driver, {}).get(name)
        if value is not None:
            groups[str(value)] += 1
    return max(groups.values(), default=0)


def explain_request(
    claim: Obj,
    req: Obj,
    request_name: str,
    *,
    w: World,
    pod: Obj | None,
    constraints: Sequence[str],
) -> RequestReport:
    meta = claim["metadata"]
    cname = f"{meta.get('namespace', '')}/{meta['name']}"
    class_name = str(req.get("deviceClassName", ""))
    rep = RequestReport(cname, request_name, class_name, _count_text(req))

    def done(f: Finding) -> RequestReport:
        rep.finding = f
        return rep

    if not w.devices:
        return done(
            Finding(
                "slices",
                "no ResourceSlices from any DRA driver on any node: nothing publishes devices"
                if not w.slice_count
                else "the published ResourceSlices hold no devices",
                "check that the kubelet plugin runs on the GPU nodes and is registered "
                "(`dradriver doctor --node NODE`)",
            )
        )
    cls = w.classes.get(class_name)
    if cls is None:
        hint = did_you_mean(class_name, w.classes)
        known = ", ".join(sorted(w.classes)) or "none"
        return done(
            Finding(
                "deviceclass",
                f"request {request_name} names DeviceClass {class_name}, which does not "
                f"exist{hint} (existing: {known})",
                "correct deviceClassName in the claim, or install the DeviceClasses "
                "(Helm chart, or kubectl apply -f deploy/deviceclasses.yaml)",
            )
        )
    class_sels, err = _compile(_selectors(cls.get("spec", {})))
    if err:
        return done(Finding("explain", f"cannot evaluate DeviceClass {class_name}: {err}"))
    req_sels, err = _compile(_selectors(req))
    if err:
        return done(Finding("explain", f"cannot evaluate request {request_name}: {err}"))

    in_class, f = _filter(class_sels, w.devices, f"DeviceClass {class_name}", w=w)
    if f:
        return done(f)
    matching, f = _filter(req_sels, in_class, f"request {request_name}", w=w)
    if f:
        return done(f)

    # Per node: what is published, matches, is held by someone else or blocked by counters.
    allocated = set(w.holders)
    left = remaining_counters(w, allocated)
    rows: dict[str, NodeRow] = {}

    def row(n: str) -> NodeRow:
        if n not in rows:
            node = w.nodes.get(n)
            r = NodeRow(n)
            if pod is not None:
                r.refused = refusal(pod, node) if node else "no such Node object"
            rows[n] = r
        return rows[n]

    free_by_node: dict[str, list[Published]] = defaultdict(list)
    asked = requested(req)
    misses: list[tuple[Published, Fit]] = []
    match_ids = {d.id for d in matching}
    class_ids = {d.id for d in in_class}
    for d in w.devices:
        for n in _nodes_of(d, w):
            r = row(n)
            r.published += 1
            r.in_class += d.id in class_ids
            if d.id not in match_ids:
                continue
            r.matching += 1
            if d.id in allocated:
                r.taken += 1
            elif untolerated(d, req):
                r.tainted += 1
            elif blocked_by_counters(d, left):
                r.counters += 1
            elif (asked or d.multi) and not (
                ft := fit(d.caps, d.multi, asked, held=w.consumed.get(d.id, {}))
            ).ok:
                r.short += 1
                misses.append((d, ft))
            else:
                r.free += 1
                free_by_node[n].append(d)
    for n, r in rows.items():
        r.usable = r.free
        for attribute in constraints:
            r.usable = min(r.usable, _group_max(free_by_node[n], attribute))
    rep.rows = sorted(rows.values(), key=lambda r: r.node)
    rep.shares = share_lines(matching, w)

    if not in_class:
        return done(_no_class_match(class_name, class_sels, w))
    if not matching:
        cond, miss = explain_miss(_joined(req_sels), in_class)
        miss = f"; {miss}" if miss else ""
        return done(
            Finding(
                "selector",
                f"0 of {len(in_class)} devices of class {class_name} match `{cond}`{miss}",
                "relax the request's selector to what the devices publish "
                "(`kubectl get resourceslices -o yaml`, or `dradriver devices` on the node)",
            )
        )
    want_all = req.get("allocationMode") == "All"
    need = 1 if want_all else int(req.get("count", 1))

    def enough(r: NodeRow, field_: str) -> bool:
        if want_all:
            return r.matching > 0 and (field_ == "matching" or r.free == r.matching)
        return int(getattr(r, field_)) >= need

    most = max(rep.rows, key=lambda r: r.matching)
    if not any(enough(r, "matching") for r in rep.rows):
        return done(
            Finding(
                "capacity",
                f"request {request_name} asks for {need} devices, and the most any node "
                f"has that match is {most.matching} ({most.node})",
                "ask for fewer devices per claim, or add nodes with more GPUs",
            )
        )
    if not any(enough(r, "free") for r in rep.rows):
        if misses and not any(r.taken or r.counters or r.tainted for r in rep.rows):
            message, fix = miss_text(request_name, class_name, asked, misses=misses, w=w)
            return done(Finding("capacity", message, fix))
        return done(
            _all_taken(request_name, need, rep.rows, matching=matching, w=w, left=left, req=req)
        )
    if constraints and not any(enough(r, "usable") for r in rep.rows):
        best = max(rep.rows, key=lambda r: r.usable)
        return done(
            Finding(
                "constraint",
                f"request {request_name} needs {need} devices with the same "
                f"{', '.join(constraints)}; the most free on one node is {best.usable} "
                f"({best.node})",
                "drop or widen the matchAttribute constraint, or ask for fewer devices",
            )
        )
    fitting = [r for r in rep.rows if enough(r, "usable" if constraints else "free")]
    placeable = [r for r in fitting if not r.refused]
    rep.fits_on = [r.node for r in placeable]
    if not placeable:
        reasons = "; ".join(f"{r.node}: {r.refused}" for r in fitting[:4])
        return done(
            Finding(
                "node",
                f"only nodes the pod may not use have the devices ({reasons})",
                "uncordon the node, add a toleration for its taint to the pod, or fix "
                "the pod's node selector or affinity",
            )
        )
    return rep


def _joined(selectors: Sequence[Selector]) -> str:
    """Selectors as the one CEL expression they amount to (all must hold)."""
    if len(selectors) == 1:
        return selectors[0].expression
    return " && ".join(f"({s.expression})" for s in selectors) if selectors else "true"


def _no_class_match(class_name: str, sels: Sequence[Selector], w: World) -> Finding:
    mig = any("mig" in s.expression.lower() for s in sels) or "mig" in class_name.lower()
    if mig and w.gates.get(PARTITIONS_GATE) is False:
        return Finding(
            "feature-gate",
            f"no MIG devices are published for DeviceClass {class_name}: dynamic MIG "
            f"partitions need the {PARTITIONS_GATE} feature gate, which is off on the "
            "API server, so the plugin does not publish them",
            f"enable {PARTITIONS_GATE} on kube-apiserver, kube-scheduler and "
            "kube-controller-manager, or run the plugin with --mig-mode static",
        )
    expr = _joined(sels)
    drivers = sorted({d.driver for d in w.devices})
    for dr in _drivers_named(expr):
        if dr not in drivers:
            return Finding(
                "slices",
                f"no ResourceSlices from driver {dr} on any node (published: "
                f"{', '.join(drivers)}), so DeviceClass {class_name} matches nothing",
                "check that the kubelet plugin of that driver runs on the GPU nodes "
                "(`dradriver doctor --node NODE`)",
            )
    cond, miss = explain_miss(expr, w.devices)
    miss = f"; {miss}" if miss else ""
    return Finding(
        "deviceclass",
        f"0 of {len(w.devices)} published devices match DeviceClass {class_name} (`{cond}`){miss}",
        "pick the DeviceClass of the devices you want, or publish them (e.g. --mig-mode "
        "for MIG devices)",
    )


def _drivers_named(expr: str) -> list[str]:
    return re.findall(r'device\.driver\s*==\s*"([^"]+)"', expr)


def tolerates(toleration: Obj, taint: Obj) -> bool:
    """A DeviceToleration against a DeviceTaint, as the scheduler matches them (an empty
    key with Exists matches every key, an empty effect every effect)."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def untolerated(d: Published, req: Obj) -> Obj | None:
    """The first taint of `d` that keeps request `req` off it."""
    tolerations = req.get("tolerations") or []
    for taint in d.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _taint_text(taint: Obj) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def _all_taken(
    request_name: str,
    need: int,
    rows: Sequence[NodeRow],
    *,
    matching: Sequence[Published],
    w: World,
    left: Mapping[tuple[str, str], Any],
    req: Obj,
) -> Finding:
    holders: dict[str, int] = defaultdict(int)
    for d in matching:
        for h in w.holders.get(d.id, []):
            holders[h] += 1
    taken = sum(r.taken for r in rows)
    by_counters = sum(r.counters for r in rows)
    tainted = [(d, t) for d in matching if d.id not in w.holders and (t := untolerated(d, req))]
    if tainted and not taken and not by_counters:
        shown = sorted({f"{d.name} ({_taint_text(t)})" for d, t in tainted})
        more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
        return Finding(
            "health",
            f"the {len(tainted)} devices matching request {request_name} that are not "
            f"allocated carry a taint it does not tolerate: {', '.join(shown[:4])}{more}",
            "a GPU the driver found unhealthy is tainted until it recovers (reset or "
            "replace it; `dradriver devices` on the node shows why); a job that may use "
            "it tolerates the taint in its request",
        )
    who = ", ".join(f"{h} ({n})" for h, n in sorted(holders.items())[:5])
    more = f" and {len(holders) - 5} more claims" if len(holders) > 5 else ""
    parts = []
    if taken:
        parts.append(f"{taken} allocated to other claims: {who}{more}")
    if by_counters:
        parts.append(
            f"{by_counters} blocked because the GPU they are carved from is used by "
            "devices allocated to other claims"
        )
    if tainted:
        parts.append(f"{len(tainted)} tainted ({_taint_text(tainted[0][1])}, not tolerated)")
    return Finding(
        "allocation",
        f"all {len(matching)} devices matching request {request_name} are taken "
        f"(needs {need} free on one node): " + "; ".join(parts),
        "wait for those claims to be released (or delete them), or add GPUs",
    )


def explain_claim(ref: ClaimRef, w: World, pod: Obj | None) -> list[RequestReport]:
    if ref.obj is None:
        why = ref.missing or Finding("claim", f"claim {ref.name} does not exist")
        return [RequestReport(ref.name, "", "", "", finding=why)]
    claim = ref.obj
    spec = claim.get("spec", {}).get("devices", {})
    constraints: dict[str, list[str]] = defaultdict(list)
    names = [r["name"] for r in spec.get("requests", [])]
    for c in spec.get("constraints") or []:
        if c.get("matchAttribute"):
            for n in c.get("requests") or names:
                constraints[n.split("/")[0]].append(c["matchAttribute"])
    out = []
    for req in spec.get("requests", []):
        name = req["name"]
        if "exactly" in req:
            out.append(
                explain_request(
                    claim, req["exactly"], name, w=w, pod=pod, constraints=constraints[name]
                )
            )
            continue
        subs = [
            explain_request(
                claim, s, f"{name}/{s['name']}", w=w, pod=pod, constraints=constraints[name]
            )
            for s in req.get("firstAvailable") or []
        ]
        good = [s for s in subs if s.finding is None]
        out.append(
            good[0]
            if good
            else subs[0]
            if subs
            else RequestReport(
                ref.name, name, "", "", finding=Finding("claim", f"request {name} is empty")
            )
        )
    return out


def _allocated_on(claim: Obj) -> str:
    alloc = claim.get("status", {}).get("allocation") or {}
    for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return "" if not alloc else "(any node)"


def explain(
    target: str,
    refs: Sequence[ClaimRef],
    w: World,
    *,
    pod: Obj | None = None,
    events: Sequence[Obj] = (),
) -> Report:
    report = Report(target)
    pending: list[ClaimRef] = []
    for ref in refs:
        node = _allocated_on(ref.obj) if ref.obj else ""
        if node:
            results = ref.obj["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
            devs = ", ".join(f"{r['pool']}/{r['device']}" for r in results)
            report.notes.append(f"claim {ref.name} is allocated on {node}: {devs}")
        else:
            pending.append(ref)
    if pod is not None and (held := imex.held_at_binding(refs, pod, events)) is not None:
        report.finding = Finding("IMEX", *held)
        return report
    for ref in pending:
        report.requests.extend(explain_claim(ref, w, pod))
    for r in report.requests:
        if r.finding:
            report.finding = r.finding
            return report
    if pod is not None and pending:
        common = set.intersection(*(set(r.fits_on) for r in report.requests))
        if not common:
            report.finding = Finding(
                "node",
                "each claim fits on some node, but no node has room for all of them",
                "ask for fewer devices in one pod, or free a node",
            )
            return report
        report.notes.append(f"the pod's claims fit on: {', '.join(sorted(common))}")
    if pod is not None:
        report.finding = _pod_state(pod, events)
        if (
            report.finding is not None
            and report.finding.layer == "scheduler"
            and any(r.shares for r in report.requests)
        ):
            report.finding = Finding("scheduler", *SHARED_SCHEDULER_BUG)
    return report


# Kubernetes 1.34's allocator checks a shared device's remaining capacity on the device
# at the request's device index in the candidate's ResourceSlice (the slice's first device
# for a one-device request), not on the candidate: kubernetes/kubernetes#133705, fixed
# for 1.35 by #133706. explain weighs each device on its own, as the fix does.
SHARED_SCHEDULER_BUG = (
    "the claims fit on a shared device as far as explain can see, but the Kubernetes 1.34 "
    "scheduler refuses them: it checks the remaining capacity of the first device in "
    "each ResourceSlice instead of the device it is placing (kubernetes/kubernetes#133705, "
    "fixed in 1.35), so once a node's first shared GPU is full no further share is "
    "placed on that node",
    "upgrade the control plane to a release with the fix, ask for less than the first "
    "GPU of a node still has, or run the node with --consumable-capacity off",
)

_PREPARE_REASONS = ("FailedPrepareDynamicResources", "FailedCreatePodSandBox", "Failed")


def _pod_state(pod: Obj, events: Sequence[Obj]) -> Finding | None:
    """For a pod whose claims are allocated: what stops it on its node, if anything."""
    status = pod.get("status", {})
    node = pod.get("spec", {}).get("nodeName", "")
    warnings = [e for e in events if e.get("type") == "Warning"]
    warnings.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    if node and status.get("phase") == "Pending":
        for e in reversed(warnings):
            if e.get("reason") in _PREPARE_REASONS:
                msg = " ".join(str(e.get("message", "")).split())
                if imex.LAYER in msg:
                    return Finding("IMEX", *imex.at_prepare(node, msg))
                return Finding(
                    "prepare",
                    f"the pod is on {node} but the kubelet could not prepare its devices: {msg}",
                    "fix what the message names (a config the webhook would refuse: install "
                    "the admission webhook); `dradriver doctor --node " + node + "` checks "
                    "the node",
                )
    if not node:
        if (failed := imex.after_binding(events)) is not None:
            return Finding("IMEX", *failed)
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return Finding(
                    "scheduler",
                    "the claims fit as far as explain can see, but the scheduler says: "
                    + " ".join(str(c.get("message", "")).split()),
                    "wait for the scheduler's next attempt, or check its log",
                )
    return None
