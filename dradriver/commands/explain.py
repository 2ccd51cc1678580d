"""`dradriver explain POD|CLAIM`: reads the pod, its claims and everything published,
and says why the claims fit nowhere (read-only; any cluster with a kubeconfig)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

# The CEL runtime and the Kubernetes client load when the command runs, not whenever the
# parser is built (every `dradriver` start, the kubelet plugin's included).
if TYPE_CHECKING:
    from dradriver.diagnose.explain_report import ClaimRef, Finding, Report
    from dradriver.diagnose.gang import Gang
    from dradriver.k8s import Kube

Obj = Mapping[str, Any]
ADM = "admissionregistration.k8s.io/v1"
SCHEDULING = "scheduling.k8s.io/v1beta1"  # PodGroups (1.37, GenericWorkload)
JOB_LABEL = "batch.kubernetes.io/job-name"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="POD|CLAIM",
        help="a pod (NAME or pod/NAME) or a ResourceClaim (claim/NAME or resourceclaim/NAME);"
        " a bare NAME is looked up as a pod first",
    )
    p.add_argument("-n", "--namespace", default="default", help="namespace (default: default)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG)")
    p.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text (a table per request and the verdict) or json",
    )


def _split(target: str) -> tuple[str, str]:
    from dradriver.commands.cluster_facts import FactsError

    kind, sep, name = target.partition("/")
    if not sep:
        return "", target
    kind = kind.lower()
    if kind in ("pod", "pods", "po"):
        return "pod", name
    if kind in ("claim", "resourceclaim", "resourceclaims"):
        return "claim", name
    raise FactsError(f"explain: {kind!r} is neither a pod nor a claim (use pod/NAME or claim/NAME)")


def _webhooks(kube: Kube, ns: str, resource: str) -> list[str] | None:
    """The validating webhooks that check creates of `resource` in `ns`; None when this
    identity may not read them (explain then says a webhook may have refused)."""
    from dradriver.diagnose.missing import checking_webhooks
    from dradriver.k8s import KubeError, path_for

    try:
        configs = kube.list(path_for(ADM, "validatingwebhookconfigurations")).get("items", [])
    except KubeError:
        return None
    labels: dict[str, str] | None
    try:
        labels = dict(
            kube.get(path_for("v1", "namespaces", name=ns))["metadata"].get("labels") or {}
        )
    except KubeError:
        labels = None  # every namespace selector is taken to match
    return checking_webhooks(configs, resource, labels)


def _pod_claims(kube: Kube, pod: Obj, ns: str, *, events: list[Obj]) -> list[ClaimRef]:
    from dradriver.commands.cluster_facts import RES, get
    from dradriver.diagnose.explain_report import ClaimRef
    from dradriver.diagnose.missing import missing_claim, missing_template, not_generated
    from dradriver.k8s import NotFound, path_for

    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses") or []
    }
    refs = []
    for entry in pod.get("spec", {}).get("resourceClaims") or []:
        template = entry.get("resourceClaimTemplateName", "")
        name = entry.get("resourceClaimName") or statuses.get(entry["name"])
        if name:
            try:
                claim = get(kube, path_for(RES, "resourceclaims", ns, name=name))
                refs.append(ClaimRef(f"{ns}/{name}", claim))
                continue
            except NotFound:
                if not template:
                    why = missing_claim(
                        f"{ns}/{name}", entry["name"], _webhooks(kube, ns, "resourceclaims")
                    )
                    refs.append(ClaimRef(f"{ns}/{name}", None, why))
                    continue
        # A claim made from a template (a generated one deleted is made again).
        try:
            get(kube, path_for(RES, "resourceclaimtemplates", ns, name=template))
            why = not_generated(f"{ns}/{template}", entry["name"], events)
        except NotFound:
            why = missing_template(
                f"{ns}/{template}", entry["name"], _webhooks(kube, ns, "resourceclaimtemplates")
            )
        refs.append(ClaimRef(f"{ns}/{entry['name']}", None, why))
    return refs


def gather(kube: Kube, target: str, ns: str) -> Report:
    from dradriver.commands.cluster_facts import (
        RES,
        FactsError,
        cluster_lists,
        feature_gates,
        get,
        items,
    )
    from dradriver.diagnose.explain import explain
    from dradriver.diagnose.explain_report import ClaimRef
    from dradriver.diagnose.world import build_world
    from dradriver.k8s import NotFound, path_for

    kind, name = _split(target)
    pod: Obj | None = None
    refs: list[ClaimRef]
    events: list[Obj] = []
    if kind in ("", "pod"):
        try:
            pod = get(kube, path_for("v1", "pods", ns, name=name))
        except NotFound:
            if kind == "pod":
                raise FactsError(f"explain: pod {ns}/{name} not found") from None
    if pod is not None:
        # The pod's events first: they say why a claim of a template was not made.
        events = items(
            kube,
            path_for("v1", "events", ns),
            fieldSelector=f"involvedObject.kind=Pod,involvedObject.name={name}",
        )
        refs = _pod_claims(kube, pod, ns, events=events)
        lists = cluster_lists(kube)
        extra, unserved, notes = _extended(kube, pod, ns, lists=lists)
        refs += extra
        if not refs and unserved is None:
            raise FactsError(
                f"explain: pod {ns}/{name} uses no ResourceClaims and asks for no extended "
                "resource a DeviceClass serves"
            )
        label = f"pod {ns}/{name}"
    else:
        try:
            refs = [
                ClaimRef(f"{ns}/{name}", get(kube, path_for(RES, "resourceclaims", ns, name=name)))
            ]
        except NotFound:
            raise FactsError(f"explain: no pod or ResourceClaim {ns}/{name}") from None
        label = f"claim {ns}/{name}"
        lists = cluster_lists(kube)
        unserved, notes = None, ()
    world = build_world(
        lists["slices"],
        lists["classes"],
        lists["claims"],
        nodes=lists["nodes"],
        gates=feature_gates(kube),
    )
    report = explain(label, refs, world, pod=pod, events=events)
    report.notes[:0] = notes
    if pod is not None and report.finding is None:
        report.finding = _daemon_down(kube, refs)
    if unserved is not None:
        report.finding = unserved
    elif pod is not None and (g := _gang(kube, pod, ns)) is not None:
        from dradriver.diagnose.gang import with_gang

        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in lists["nodes"]}
        with_gang(report, f"{ns}/{name}", g, labels=labels)
    return report


def _daemon_down(kube: Kube, refs: list[ClaimRef]) -> Finding | None:
    """A daemon one of the pod's claims depends on (MPS, IMEX) that does not serve, where
    this identity may list the daemons' pods."""
    from dradriver.commands.cluster_facts import FactsError, items
    from dradriver.diagnose import daemons
    from dradriver.diagnose.explain_report import Finding
    from dradriver.k8s import path_for

    claims = [r.obj for r in refs if r.obj is not None]
    if not claims:
        return None
    try:
        pods = items(kube, path_for("v1", "pods"), labelSelector=daemons.SELECTOR)
    except FactsError:
        return None  # not allowed to list pods everywhere: nothing said of daemons
    found = daemons.down(pods, claims)
    return Finding("daemon", *found) if found is not None else None


def _gang(kube: Kube, pod: Obj, ns: str) -> Gang | None:
    """The gang the pod is one of (diagnose/gang.py says what counts), with its pods."""
    from dradriver.commands.cluster_facts import FactsError, get, items
    from dradriver.diagnose import gang
    from dradriver.k8s import KubeError, path_for

    pods = path_for("v1", "pods", ns)
    try:
        if (group := gang.group_name(pod)) is not None:
            pg = get(kube, path_for(SCHEDULING, "podgroups", ns, name=group))
            size, kind, name = gang.gang_size(pod_group=pg), "PodGroup", group
            topology = gang.topology_keys(pg)
            members = [p for p in items(kube, pods) if gang.group_name(p) == group]
        elif (job := gang.job_name(pod)) is not None:
            size = gang.gang_size(job=get(kube, path_for("batch/v1", "jobs", ns, name=job)))
            kind, name, topology = "Job", job, ()
            members = items(kube, pods, labelSelector=f"{JOB_LABEL}={job}")
        else:
            return None
    except (KubeError, FactsError):
        # Gone meanwhile, not served (before 1.37), or not ours to read: no gang to tell.
        return None
    if size is None:
        return None
    return gang.gang(kind=kind, name=f"{ns}/{name}", size=size, pods=members, topology=topology)


def _extended(
    kube: Kube, pod: Obj, ns: str, *, lists: Mapping[str, list[Obj]]
) -> tuple[list[ClaimRef], Finding | None, tuple[str, ...]]:
    """The claim the scheduler made for the pod's extended resources (DRAExtendedResource),
    or the one it would make; and a finding for a resource nothing serves."""
    from dradriver.commands.cluster_facts import RES, get
    from dradriver.diagnose import extended
    from dradriver.diagnose.explain_report import ClaimRef
    from dradriver.k8s import NotFound, path_for

    made = (pod.get("status", {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if made:
        try:
            return (
                [
                    ClaimRef(
                        f"{ns}/{made}", get(kube, path_for(RES, "resourceclaims", ns, name=made))
                    )
                ],
                None,
                (),
            )
        except NotFound:
            pass  # deleted with a stale allocation: the scheduler makes it again
    plan = extended.plan(pod, lists["classes"], lists["nodes"])
    refs = [] if plan.claim is None else [ClaimRef(str(plan.claim["metadata"]["name"]), plan.claim)]
    return refs, plan.unserved, plan.notes


def render(report: Report) -> str:
    out = [f"{report.target}:"]
    out += [f"  {n}" for n in report.notes]
    for r in report.requests:
        if not r.request:
            continue
        out.append(
            f"  claim {r.claim} request {r.request}: class {r.device_class or '-'}, "
            f"count {r.count or '-'}"
        )
        if r.rows:
            head = (
                "NODE", "PUBLISHED", "IN-CLASS", "MATCHING", "TAKEN", "COUNTERS", "TAINTED",
                "SHORT", "FREE", "",
            )  # fmt: skip
            table = [head] + [
                (
                    x.node,
                    str(x.published),
                    str(x.in_class),
                    str(x.matching),
                    str(x.taken),
                    str(x.counters),
                    str(x.tainted),
                    str(x.short),
                    str(x.free),
                    x.refused,
                )
                for x in r.rows
            ]
            widths = [max(len(row[i]) for row in table) for i in range(len(head))]
            for row in table:
                out.append(
                    "    "
                    + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                )
        out += [f"    shared: {line}" for line in r.shares]
    if report.finding:
        out.append(f"=> {report.finding.line()}")
    else:
        out.append("=> ok: nothing found that keeps these claims from being allocated")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    from dradriver.commands.cluster_facts import FactsError, connect

    try:
        kube = connect(args.kubeconfig)
        try:
            report = gather(kube, args.target, args.namespace)
        finally:
            kube.close()
    except FactsError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(render(report))
    return 1 if report.finding else 0
