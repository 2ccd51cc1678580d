"""One request of a claim walked through the steps the scheduler takes (published, class,
selectors, count, free, counters, node): the devices counted per node at each step, and
the first step that fails as a finding. The findings that need more than the count are in
explain_selectors.py and explain_taken.py; a claim and a pod are in explain.py."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.api.suggest import did_you_mean
from dradriver.diagnose.capacity import Fit, fit, requested
from dradriver.diagnose.cel import CompileError, Selector
from dradriver.diagnose.explain_report import Finding, NodeRow, RequestReport
from dradriver.diagnose.explain_selectors import joined, no_class_match, runtime_error
from dradriver.diagnose.explain_taken import all_taken, untolerated
from dradriver.diagnose.nearest import explain_miss, missing_name
from dradriver.diagnose.nodes import refusal
from dradriver.diagnose.shares import miss_text, share_lines
from dradriver.diagnose.world import (
    Published,
    World,
    blocked_by_counters,
    remaining_counters,
)

Obj = Mapping[str, Any]


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
                return [], runtime_error(message, miss, len(w.devices))
            if not o.matches:
                ok = False
                break
        if ok:
            out.append(d)
    return out, None


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
        return done(no_class_match(class_name, class_sels, w))
    if not matching:
        cond, miss = explain_miss(joined(req_sels), in_class)
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
            all_taken(request_name, need, rep.rows, matching=matching, w=w, left=left, req=req)
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
