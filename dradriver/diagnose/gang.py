"""A pod's gang (pure): the group of pods that only work together, how much of it is
placed, and whether the fleet has room for the rest at once.

A gang is what the scheduler or the platform says it is:
- a PodGroup with a gang policy (1.37's gang scheduling, GenericWorkload): the pod names
  it in spec.schedulingGroup; it needs minCount pods placed at once;
- an Indexed Job whose parallelism equals its completions (each pod one rank of a
  distributed job, as torchrun and MPI launchers run them): every rank must run at once;
- a Job in a Kueue queue: Kueue admits its pods as one (and, with waitForPodsReady,
  evicts it unless they all run).
Placing one pod at a time, the scheduler can bind part of a gang; its placed pods hold
their devices, and do nothing, until the rest are placed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dradriver.diagnose.explain_report import Finding, Report, RequestReport
from dradriver.diagnose.world import claim_names

Obj = Mapping[str, object]
LAYER = "gang"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True)
class Gang:
    kind: str  # "PodGroup" or "Job"
    name: str  # namespace/name
    size: int  # the pods it needs placed at once
    members: tuple[str, ...]  # the pods of it that exist
    placed: tuple[str, ...]  # those bound to a node
    # The claims of the placed pods (namespace/name): what it holds while it waits.
    claims: frozenset[str] = frozenset()
    # Node labels whose one value all its pods must share (a PodGroup's topology
    # constraints, TopologyAwareWorkloadScheduling): one NVLink domain, one rack.
    topology: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        return len(self.placed) >= self.size

    def what(self) -> str:
        return f"{self.kind} {self.name}"


def _get(obj: object, *path: str) -> object:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def group_name(pod: Obj) -> str | None:
    """The PodGroup the pod names (spec.schedulingGroup.podGroupName), if any."""
    name = _get(pod, "spec", "schedulingGroup", "podGroupName")
    return name if isinstance(name, str) and name else None


def job_name(pod: Obj) -> str | None:
    """The Job that controls the pod, if one does."""
    owners = _get(pod, "metadata", "ownerReferences")
    for o in owners if isinstance(owners, list) else []:
        if isinstance(o, Mapping) and o.get("kind") == "Job" and o.get("controller"):
            name = o.get("name")
            return name if isinstance(name, str) else None
    return None


def topology_keys(pod_group: Obj) -> tuple[str, ...]:
    constraints = _get(pod_group, "spec", "schedulingConstraints", "topology")
    keys = [_get(c, "key") for c in (constraints if isinstance(constraints, list) else [])]
    return tuple(k for k in keys if isinstance(k, str) and k)


def gang_size(*, pod_group: Obj | None = None, job: Obj | None = None) -> int | None:
    """How many pods the gang needs at once: a PodGroup's gang minCount; an Indexed
    Job's parallelism when it equals its completions; None when it is no gang."""
    if pod_group is not None:
        return _int(_get(pod_group, "spec", "schedulingPolicy", "gang", "minCount"))
    if job is not None:
        spec = _get(job, "spec")
        parallelism, completions = _int(_get(spec, "parallelism")), _int(_get(spec, "completions"))
        if not parallelism or parallelism < 2:
            return None
        if _get(job, "metadata", "labels", KUEUE_QUEUE) is not None:
            # Kueue admits a Job's pods as one, and its waitForPodsReady wants them all
            # running: as many as can run at once.
            return min(parallelism, completions or parallelism)
        if _get(spec, "completionMode") == "Indexed" and parallelism == completions:
            return parallelism
    return None


def _live(p: Obj) -> bool:
    phase = _get(p, "status", "phase")
    return not _get(p, "metadata", "deletionTimestamp") and phase in ("Pending", "Running")


def gang(
    *, kind: str, name: str, size: int, pods: Sequence[Obj], topology: tuple[str, ...] = ()
) -> Gang:
    """The gang of `size` whose live member pods are `pods`."""
    live = sorted((p for p in pods if _live(p)), key=lambda p: str(_get(p, "metadata", "name")))
    names = tuple(str(_get(p, "metadata", "name")) for p in live)
    bound = [p for p in live if _get(p, "spec", "nodeName")]
    placed = tuple(str(_get(p, "metadata", "name")) for p in bound)
    claims = frozenset(
        f"{_get(p, 'metadata', 'namespace') or ''}/{n}" for p in bound for n in claim_names(p)
    )
    return Gang(kind, name, size, names, placed, claims, topology)


def gangs(pods: Sequence[Obj], *, pod_groups: Sequence[Obj], jobs: Sequence[Obj]) -> list[Gang]:
    """Every gang `pods` belong to: by PodGroup, else by the Job that controls them."""

    def key(obj: Obj) -> tuple[str, str]:
        return str(_get(obj, "metadata", "namespace") or ""), str(_get(obj, "metadata", "name"))

    sizes: dict[tuple[str, str, str], int] = {}
    for pg in pod_groups:
        if (n := gang_size(pod_group=pg)) is not None:
            sizes[("PodGroup", *key(pg))] = n
    for j in jobs:
        if (n := gang_size(job=j)) is not None:
            sizes[("Job", *key(j))] = n
    members: dict[tuple[str, str, str], list[Obj]] = {}
    for p in pods:
        ns = key(p)[0]
        group, job = group_name(p), job_name(p)
        for k in (("PodGroup", ns, group), ("Job", ns, job)):
            if k[2] is not None and k in sizes:
                members.setdefault((k[0], k[1], k[2]), []).append(p)
                break
    return [
        gang(kind=kind, name=f"{ns}/{name}", size=sizes[(kind, ns, name)], pods=ps)
        for (kind, ns, name), ps in sorted(members.items())
    ]


def room(requests: Sequence[RequestReport]) -> dict[str, int]:
    """Per node, how many more pods with these requests fit there at once: the free
    devices of each request over its count, the least over the requests; nodes the pod
    may not go to (cordoned, tainted, not selected) have none."""
    per_request = []
    for r in requests:
        count = int(r.count) if r.count.isdigit() else 0  # "all": one pod takes every one
        per_request.append(
            {
                row.node: row.usable // count if count else int(row.usable > 0)
                for row in r.rows
                if not row.refused
            }
        )
    if not per_request:
        return {}
    nodes = set.intersection(*(set(slots) for slots in per_request))
    fits = {n: min(slots[n] for slots in per_request) for n in nodes}
    return {n: k for n, k in fits.items() if k > 0}


def with_gang(
    report: Report, pod: str, g: Gang, *, labels: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """A report on a pod of a gang not placed whole says that it waits for its gang, and
    what the pod lacks where the devices it wants are taken; a pod that could never fit
    (no such device, a selector nothing matches) keeps that finding, the gang a note."""
    if g.whole:
        return
    found = waiting(pod, g, room(report.requests), labels=labels or {})
    own = report.finding
    if own is None or own.layer == "scheduler":
        report.finding = found
    elif own.layer == "allocation":
        lack = own.message.rstrip(" .")
        report.finding = Finding(LAYER, f"{found.message}; what it lacks: {lack}", found.fix)
    else:
        report.notes.append(found.message)


def _where(fits: Mapping[str, int]) -> str:
    return ", ".join(f"{n} ({k})" if k > 1 else n for n, k in sorted(fits.items()))


def _in_one_domain(
    fits: Mapping[str, int], key: str, labels: Mapping[str, Mapping[str, str]]
) -> tuple[int, str]:
    """The most such pods that fit at once in one domain of the node label `key`, and
    where; nodes without the label are in none."""
    by_domain: dict[str, dict[str, int]] = {}
    for n, k in fits.items():
        if (value := labels.get(n, {}).get(key)) is not None:
            by_domain.setdefault(value, {})[n] = k
    best = max(by_domain.items(), key=lambda kv: (sum(kv[1].values()), kv[0]), default=None)
    if best is None:
        return 0, ""
    return sum(best[1].values()), f"{best[0]}: {_where(best[1])}"


def waiting(
    pod: str, g: Gang, fits: Mapping[str, int], *, labels: Mapping[str, Mapping[str, str]]
) -> Finding:
    """The finding for a pod of a gang not placed whole: which gang, how many of how many
    are placed, and whether the rest fit at once (in one domain, where it must be)."""
    short = g.size - len(g.placed)
    at_once = sum(fits.values())
    placed = f"{len(g.placed)} of {g.size} pods placed"
    if g.placed:
        placed += f" ({', '.join(g.placed)}), holding their devices until the rest are"
    room_text = (
        f"the fleet has room for {at_once} more such pods at once ({_where(fits)}), {short} needed"
        if at_once
        else f"no node has room for another such pod now, {short} needed"
    )
    within, usable = "", at_once
    for key in g.topology:
        most, where = _in_one_domain(fits, key, labels)
        if most < min(at_once, short):
            room_text = (
                f"the fleet has room for {at_once} more such pods at once, but at most "
                f"{most} in one {key}{f' ({where})' if where else ''}, {short} needed"
            )
            within, usable = f" in one {key}", most
            break
    if g.kind == "PodGroup":
        fix = (
            f"nothing, if other work holds the devices: the group is placed whole, in one "
            f"go, once {short} pods fit at once{within}; or free room for "
            f"{short - min(usable, short)} more{within}, or lower the PodGroup's minCount"
        )
    else:
        fix = (
            "no gang scheduler holds this Job back, so its placed ranks hold their devices "
            "while it waits: submit it through Kueue with waitForPodsReady, or on 1.37 as a "
            "PodGroup (docs/user-guide.md, all-or-nothing placement)"
        )
    return Finding(LAYER, f"pod {pod} waits for its gang, {g.what()}: {placed}; {room_text}", fix)
