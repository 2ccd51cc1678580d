"""Extended resources served by DRA (`resources.limits: nvidia.com/gpu: 2`, no claim;
the DRAExtendedResource gate, alpha in 1.34), as the scheduler reads them, for explain.

The scheduler (v1.34 dynamicresources.go, extended/extended.go) maps a resource name to a
DeviceClass: the class's spec.extendedResourceName, and for every class its implicit name
`deviceclass.resource.kubernetes.io/<class>` (which 1.34 then never matches, see
is_extended). A pod asking for a mapped name that its node
does not advertise itself (a device plugin's allocatable) gets a claim the scheduler makes
for it: one request per container and resource, `container-<i>-request-<j>` (i counts
init containers first, j is the resource's place among the container's sorted request
names), ExactCount of the class, owned by the pod and annotated
resource.kubernetes.io/extended-resource-claim. Once made, its name is in the pod's
status.extendedResourceClaimStatus, and explain reads it like any claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.api.quantity import parse
from dradriver.diagnose.explain_report import Finding

Obj = Mapping[str, Any]
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def is_extended(name: str) -> bool:
    """v1helper.IsExtendedResourceName: a name with a domain outside *kubernetes.io/.
    So in 1.34 a class's implicit name, itself under kubernetes.io/, is never asked for
    by a container (the scheduler skips it as a native resource)."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def class_mapping(classes: Sequence[Obj]) -> dict[str, list[str]]:
    """Resource name -> the DeviceClasses that serve it (more than one: the scheduler
    takes whichever its lister returns last, so explain says the choice is not fixed)."""
    out: dict[str, list[str]] = {}
    for c in classes:
        name = str(c.get("metadata", {}).get("name", ""))
        explicit = (c.get("spec") or {}).get("extendedResourceName")
        out.setdefault(IMPLICIT_PREFIX + name, []).append(name)
        if explicit:
            out.setdefault(str(explicit), []).append(name)
    return out


def _containers(pod: Obj) -> list[Obj]:
    spec = pod.get("spec", {})
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _requests(container: Obj) -> dict[str, str]:
    """A container's requests as the API server defaults them: a limit with no request
    is also its request."""
    res = container.get("resources") or {}
    out = {str(k): str(v) for k, v in (res.get("limits") or {}).items()}
    out.update({str(k): str(v) for k, v in (res.get("requests") or {}).items()})
    return out


@dataclass(frozen=True)
class Asked:
    container: str
    resource: str
    count: int
    request: str  # the scheduler's request name for it


def asked(pod: Obj) -> list[Asked]:
    """Every extended resource a container of the pod asks for, with the request name the
    scheduler would give it."""
    out = []
    for i, c in enumerate(_containers(pod)):
        reqs = _requests(c)
        names = sorted(reqs)
        for r in names:
            if not is_extended(r):
                continue
            amount = parse(reqs[r])
            if amount <= 0 or amount.denominator != 1:
                continue
            out.append(
                Asked(
                    str(c.get("name", "")),
                    r,
                    int(amount),
                    f"container-{i}-request-{names.index(r)}",
                )
            )
    return out


def advertised(nodes: Sequence[Obj], resource: str) -> list[str]:
    """Nodes whose allocatable has `resource` (a device plugin serves it there)."""
    return sorted(
        str(n["metadata"]["name"])
        for n in nodes
        if parse(str((n.get("status", {}).get("allocatable") or {}).get(resource, "0"))) > 0
    )


@dataclass(frozen=True)
class Plan:
    """What explain weighs for a pod's extended resources: the claim the scheduler would
    make (None when nothing is served by DRA), and findings and notes on the rest."""

    claim: Obj | None
    unserved: Finding | None
    notes: tuple[str, ...]


def plan(pod: Obj, classes: Sequence[Obj], nodes: Sequence[Obj]) -> Plan:
    mapping = class_mapping(classes)
    requests: list[Obj] = []
    notes: list[str] = []
    unserved: list[Asked] = []
    for a in asked(pod):
        served = mapping.get(a.resource, [])
        by_plugin = advertised(nodes, a.resource)
        if by_plugin:
            notes.append(
                f"container {a.container} asks for {a.count} {a.resource}, which a device "
                f"plugin advertises on {', '.join(by_plugin[:5])}"
                + (f" and {len(by_plugin) - 5} more" if len(by_plugin) > 5 else "")
                + (
                    "; there the device plugin serves it, elsewhere DeviceClass "
                    + " or ".join(served)
                    if served
                    else ""
                )
            )
            if not served:
                continue
        if not served:
            unserved.append(a)
            continue
        if len(served) > 1:
            notes.append(
                f"{a.resource} is served by DeviceClasses {', '.join(sorted(served))}: the "
                "scheduler picks one of them, not always the same; give it to one class only"
            )
        notes.append(
            f"container {a.container} asks for {a.count} {a.resource}: the scheduler "
            f"allocates it through DRA as request {a.request} of DeviceClass {served[-1]}"
        )
        requests.append(
            {
                "name": a.request,
                "exactly": {
                    "deviceClassName": served[-1],
                    "allocationMode": "ExactCount",
                    "count": a.count,
                },
            }
        )
    finding = None
    if unserved:
        a = unserved[0]
        finding = Finding(
            "deviceclass",
            f"container {a.container} asks for {a.count} {a.resource}, which no node "
            f"advertises and no DeviceClass serves (none has extendedResourceName "
            f"{a.resource})",
            f"for dradriver's GPUs, install its chart with extendedResourceClass.enabled=true"
            f" (a DeviceClass with extendedResourceName {a.resource}; the DRAExtendedResource "
            "gate on kube-apiserver, kube-scheduler, kube-controller-manager and the "
            "kubelets), or give the pod a ResourceClaim instead",
        )
    claim = None
    if requests:
        meta = pod.get("metadata", {})
        claim = {
            "metadata": {
                "namespace": meta.get("namespace", ""),
                "name": f"{meta.get('name', '')}-extended-resources (not made yet)",
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            },
            "spec": {"devices": {"requests": requests}},
        }
    return Plan(claim, finding, tuple(notes))
