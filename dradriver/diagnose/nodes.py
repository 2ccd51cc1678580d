"""Why the scheduler would not put a pod on a node, apart from its claims: cordon, a
taint it does not tolerate, its node selector or required node affinity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Obj = Mapping[str, Any]


def _tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("key") and t["key"] != taint.get("key"):
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches(expr: Obj, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def refusal(pod: Obj, node: Obj) -> str:
    """Empty when the pod may go to the node; otherwise the reason, as a person says it."""
    spec = pod.get("spec", {})
    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    if spec.get("nodeName") and spec["nodeName"] != name:
        return f"the pod is bound to node {spec['nodeName']}"
    if node.get("spec", {}).get("unschedulable"):
        return "cordoned"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            spec.get("tolerations") or [], taint
        ):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"taint {taint.get('key')}{value}:{taint.get('effect')} not tolerated"
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return f"node selector {k}={v} does not match"
    required = (
        (spec.get("affinity") or {}).get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )  # fmt: skip
    if required:
        terms = required.get("nodeSelectorTerms") or []
        if terms and not any(
            all(_matches(e, labels) for e in t.get("matchExpressions") or [])
            and all(_matches(e, {"metadata.name": name}) for e in t.get("matchFields") or [])
            for t in terms
        ):
            return "required node affinity does not match"
    return ""
