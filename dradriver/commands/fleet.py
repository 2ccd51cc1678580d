"""`dradriver fleet`: the fleet's GPUs per node and product, what each node can still
place, and the capacity the Pending pods cannot use where it is (read-only; one LIST of
each kind, any cluster a kubeconfig reaches)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dradriver.diagnose.fleet_report import FleetReport
    from dradriver.diagnose.gang import Gang
    from dradriver.diagnose.world import World
    from dradriver.k8s import Kube

    Obj = Mapping[str, Any]

SCHEDULING = "scheduling.k8s.io/v1beta1"  # PodGroups (1.37, GenericWorkload)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG)")
    p.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text",
        help="text (a table per node, the totals and the stranded GPUs) or json",
    )
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        default=None,
        metavar="X",
        help="what a GPU costs an hour: the stranded GPUs' cost is shown",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="judge stranding by the Pending pods of this namespace only (a team's view); "
        "default: every namespace's",
    )
    p.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also write the fleet's picture to FILE: one self-contained HTML page, a row per "
        "node and a cell per GPU coloured by its state (hover names the claim and pod)",
    )
    p.add_argument(
        "--quota-classes",
        action="store_true",
        help="print the Helm values (quotaClasses) for a DeviceClass per product and MIG "
        "profile the fleet publishes, for quotas that count them (Kueue)",
    )
    p.add_argument(
        "--kueue",
        action="store_true",
        help="print Kueue's configuration (resources.deviceClassMappings) charging each of "
        "those classes as a quota resource of its name (with --quota-classes: both)",
    )


@dataclass(frozen=True)
class Gathered:
    """The report, and what it was made from that the picture needs too (which claim holds
    each device)."""

    report: FleetReport
    world: World
    claims: list[Obj]


def gather(kube: Kube, price: float | None, namespace: str | None = None) -> FleetReport:
    return gather_all(kube, price, namespace).report


def gather_all(kube: Kube, price: float | None, namespace: str | None = None) -> Gathered:
    from dradriver.commands.cluster_facts import cluster_lists, items
    from dradriver.diagnose.fleet import fleet, partial_gangs
    from dradriver.diagnose.fleet_claims import held_by_finished, pending_requests
    from dradriver.diagnose.world import build_world
    from dradriver.k8s import path_for

    lists = cluster_lists(kube)
    pods = items(kube, path_for("v1", "pods", namespace), fieldSelector="status.phase=Pending")
    classes = {c["metadata"]["name"]: c for c in lists["classes"]}
    requests, unreadable = pending_requests(pods, lists["claims"], classes)
    world = build_world(lists["slices"], lists["classes"], lists["claims"], nodes=lists["nodes"])
    report = fleet(world, requests, price)
    report.unreadable = unreadable
    finished = items(
        kube,
        path_for("v1", "pods", namespace),
        fieldSelector="status.phase!=Pending,status.phase!=Running",
    )
    report.held = held_by_finished(lists["claims"], finished)
    report.stranded += partial_gangs(world, _gangs(kube, namespace, pending=pods))
    return Gathered(report, world, lists["claims"])


def _gangs(kube: Kube, namespace: str | None, *, pending: list[Obj]) -> list[Gang]:
    """The gangs with a Pending pod (diagnose/gang.py says what counts), with all their
    pods."""
    from dradriver.commands.cluster_facts import FactsError, items
    from dradriver.diagnose.gang import gangs
    from dradriver.k8s import KubeError, path_for

    if not pending:
        return []
    running = items(kube, path_for("v1", "pods", namespace), fieldSelector="status.phase=Running")
    jobs = items(kube, path_for("batch/v1", "jobs", namespace))
    try:
        groups = items(kube, path_for(SCHEDULING, "podgroups", namespace))
    except (KubeError, FactsError):
        groups = []  # not served before 1.37 (or without GenericWorkload)
    return gangs([*pending, *running], pod_groups=groups, jobs=jobs)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render(r: FleetReport) -> str:
    from dradriver.api.quantity import human

    sharing = any(c.shared for c in r.totals.values()) or any(v.largest_share for v in r.nodes)
    head: tuple[str, ...] = (
        "NODE",
        "PRODUCT",
        "GPUS",
        "ALLOCATED",
        "CARVED",
        "TAINTED",
        "FREE",
        "FITS",
    )
    if sharing:  # consumable capacity somewhere: the GPUs holding shares get a column
        head = (*head[:5], "SHARED", *head[5:])
    rows: list[tuple[str, ...]] = [head]
    for v in r.nodes:
        for product, c in sorted(v.products.items()):
            row = [v.node, product, str(c.published), str(c.allocated), str(c.carved)]
            row += [str(c.shared)] if sharing else []
            row += [str(c.tainted), str(c.free), ", ".join(v.shapes()) or "-"]
            rows.append(tuple(row))
    out = _table(rows) if len(rows) > 1 else ["no GPUs of gpu.dradriver.io published"]
    for v in r.nodes:
        for g in v.shared:
            out.append(
                f"  {v.node} {g.device}: {g.claims} "
                f"{'share holds' if g.claims == 1 else 'shares hold'} "
                f"{human(g.memory_held)} of {human(g.memory)}"
            )
    out.append("")
    for product, c in sorted(r.totals.items()):
        busy = 100 * (c.allocated + c.carved + c.shared) / c.published if c.published else 0.0
        shared = f", {c.shared} shared" if c.shared else ""
        out.append(
            f"total {product}: {c.published} GPUs, {c.allocated} allocated, {c.carved} carved "
            f"into MIG{shared}, {c.tainted} tainted, {c.free} free ({busy:.0f}% busy)"
        )
    if r.held:
        out.append(
            f"held by finished pods: {r.held_devices} GPUs allocated to claims whose pods "
            "have all finished"
        )
        for h in r.held:
            why = (
                " (the scheduler's claim for an extended resource: Kubernetes 1.34 keeps it "
                "while the pod exists, kubernetes/kubernetes#134311; delete the finished "
                "pods or give their Jobs a ttlSecondsAfterFinished)"
                if h.extended
                else ""
            )
            out.append(f"  {h.node} {h.claim}: {h.devices} held by {', '.join(h.pods)}{why}")
    out.append(f"pending requests: {len(r.requests)}")
    if r.unreadable:
        out.append(f"claims whose selectors do not compile: {', '.join(r.unreadable)}")
    if not r.requests:
        out.append("stranded: none (no Pending pod asks for these devices)")
        return "\n".join(out)
    if not r.stranded:
        out.append("stranded: none (every free GPU can serve a Pending claim where it is)")
        return "\n".join(out)
    cost = r.cost_per_hour()
    held = sum(s.gpus for s in r.stranded if s.reason == "partial-gang")
    what = f"{r.stranded_gpus - held} free GPUs no Pending claim can use where they are"
    if held:
        what = (
            f"{r.stranded_gpus} GPUs: {what}, and {held} held by gangs placed in part, idle "
            "until the rest of each is placed"
        )
    out.append(
        f"stranded: {what}"
        + (f", {cost:.2f} an hour" if cost is not None else "")
        + (
            f"; {human(r.stranded_memory)} left on shared GPUs that no Pending share fits in"
            if r.stranded_memory
            else ""
        )
    )
    rows = [("NODE", "PRODUCT", "GPUS", "REASON", "DETAIL")]
    rows += [(s.node, s.product, str(s.gpus), s.reason, s.detail) for s in r.stranded]
    out += ["  " + line for line in _table(rows)]
    return "\n".join(out)


def _print_quota_classes(kube: Kube, helm_values: bool, kueue: bool) -> int:
    import yaml

    from dradriver.commands.cluster_facts import cluster_lists
    from dradriver.diagnose.fleet_quota import kueue_mappings, quota_class_names, quota_classes
    from dradriver.diagnose.world import build_world

    lists = cluster_lists(kube)
    w = build_world(lists["slices"], lists["classes"], lists["claims"], nodes=lists["nodes"])
    values = quota_classes(w)
    if helm_values:
        print(
            "# helm upgrade ... -f this-file: a DeviceClass per product and MIG profile published"
        )
        print(yaml.safe_dump({"quotaClasses": values}, sort_keys=False), end="")
    if kueue:
        if helm_values:
            print("---")
        print(
            "# Kueue's Configuration (featureGates: {DynamicResourceAllocation: true}): those"
            " classes as quota resources"
        )
        print(yaml.safe_dump(kueue_mappings(quota_class_names(values)), sort_keys=False), end="")
    return 0


def run(args: argparse.Namespace) -> int:
    from dradriver.commands.cluster_facts import FactsError, connect
    from dradriver.diagnose.fleet_report import as_dict

    try:
        kube = connect(args.kubeconfig)
        try:
            if args.quota_classes or args.kueue:
                return _print_quota_classes(kube, args.quota_classes, args.kueue)
            got = gather_all(kube, args.price_per_gpu_hour, args.namespace)
        finally:
            kube.close()
    except FactsError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.html:
        from dradriver.diagnose.fleet_page import page
        from dradriver.diagnose.fleet_picture import picture

        try:
            Path(args.html).write_text(page(picture(got.world, got.report, got.claims), got.report))
        except OSError as exc:
            print(f"cannot write the picture to {args.html}: {exc}", file=sys.stderr)
            return 2
    report = got.report
    print(json.dumps(as_dict(report), indent=2) if args.output == "json" else render(report))
    return 0
