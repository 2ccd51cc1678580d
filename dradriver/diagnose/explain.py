"""`dradriver explain`, the pure part: each request of each claim walked through the
steps the scheduler takes (published, class, selectors, count, free, counters, node), with
the first step that fails said in one line, with its layer and its fix.

Here, what is said of a claim and a pod as a whole: a claim's requests (of firstAvailable,
the first that fits), the claims already allocated, a node with room for all of a pod's
claims, and what stops a pod whose claims are allocated. One request's walk is in
explain_request.py, what a report holds in explain_report.py."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.diagnose import imex
from dradriver.diagnose.explain_report import ClaimRef, Finding, Report, RequestReport
from dradriver.diagnose.explain_request import explain_request
from dradriver.diagnose.world import World

Obj = Mapping[str, Any]


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
