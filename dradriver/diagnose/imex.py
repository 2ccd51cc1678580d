"""What explain says of a ComputeDomain pod held by its IMEX channel (pure): at prepare
(the kubelet's event, without binding conditions), while the scheduler holds its binding
(the node's IMEXDaemonReady / IMEXDaemonFailed in the claim's status), and after a
failed binding (the scheduler's event). Each is (what, fix), the IMEX layer's finding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dradriver.api import computedomain as cd

Obj = Mapping[str, Any]

# What to do about each IMEX failure (kubeletplugin/hardware/imex.py says them).
FIXES = (
    (
        "waiting for its nodes",
        "the job's other pods must be scheduled too (`dradriver explain` on a pending one, "
        "`kubectl get computedomain -o yaml` for who joined); the kubelet retries",
    ),
    (
        "did not answer READY",
        "look at the node's IMEX daemon pod (`kubectl logs` and `kubectl describe` of the pod "
        "the message names) and `nvidia-imex-ctl -N` on the node; the kubelet retries",
    ),
    ("is not serving", "the daemon pod the message names says why (`kubectl describe pod`)"),
    (
        "fabric clique",
        "the domain's pods must run in its clique: delete the pods, whose new claims are "
        "placed by the domain's template",
    ),
    ("not found", "create the ComputeDomain again, or delete the job's pods"),
    ("made again", "delete the job's pods: their new claims come from the new domain"),
)
LAYER = "IMEX layer: "


class _Claim(Protocol):
    @property
    def obj(self) -> Obj | None: ...


def fix_for(text: str, binding: bool = False) -> str:
    fix = next((f for key, f in FIXES if key in text), "")
    # Before binding the scheduler, not the kubelet, tries again.
    return fix.replace("the kubelet retries", "the scheduler tries again") if binding else fix


def _after_layer(msg: str) -> str:
    return msg.split(LAYER, 1)[1] if LAYER in msg else msg


def at_prepare(node: str, msg: str) -> tuple[str, str]:
    text = _after_layer(msg)
    return (
        f"the pod is on {node}, waiting for its ComputeDomain's IMEX channel: {text}",
        fix_for(text) or f"`dradriver doctor --node {node}` checks the node",
    )


def last_failed_binding(events: Sequence[Obj]) -> str:
    """The newest of the scheduler's events of a binding an IMEX daemon failed, past its
    layer: the scheduler quotes the node's condition message (Go %q, hence the quote)."""
    warned = [
        e
        for e in events
        if e.get("reason") == "FailedScheduling" and LAYER in str(e.get("message", ""))
    ]
    warned.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    if not warned:
        return ""
    text = _after_layer(" ".join(str(warned[-1].get("message", "")).split()))
    return text.rstrip('"').replace('\\"', '"')


def after_binding(events: Sequence[Obj]) -> tuple[str, str] | None:
    """An unbound pod whose last binding a node's IMEX daemon failed."""
    last = last_failed_binding(events)
    if not last:
        return None
    return (
        "the scheduler could not bind the pod: the node's IMEX daemon did not get ready, "
        f"so it places the pod again: {last}",
        fix_for(last, binding=True) or "`dradriver doctor` on the node named",
    )


def _channel_conditions(claim: Obj, result: Obj) -> dict[str, Obj]:
    key = (result.get("driver"), result.get("pool"), result.get("device"))
    for d in (claim.get("status") or {}).get("devices") or []:
        if (d.get("driver"), d.get("pool"), d.get("device")) == key:
            return {str(c.get("type")): c for c in d.get("conditions") or []}
    return {}


def held_at_binding(
    refs: Sequence[_Claim], pod: Obj, events: Sequence[Obj]
) -> tuple[str, str] | None:
    """An unbound pod whose claim holds a channel the scheduler waits on."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for ref in refs:
        claim = ref.obj or {}
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            if cd.BINDING_CONDITION not in (r.get("bindingConditions") or []):
                continue
            node = str(r.get("pool", ""))
            conds = _channel_conditions(claim, r)
            failed = conds.get(cd.BINDING_FAILURE, {})
            if failed.get("status") == "True":
                text = _after_layer(str(failed.get("message", "")))
                return (
                    f"{node} could not get the pod's IMEX daemon ready, and the scheduler "
                    f"places the pod again: {text}",
                    fix_for(text, binding=True),
                )
            said = conds.get(cd.BINDING_CONDITION, {})
            if said.get("status") == "True":
                continue
            now = _after_layer(str(said.get("message", ""))) or (
                f"{node}'s plugin is starting it and has not reported yet"
            )
            last = last_failed_binding(events)
            text = f"the scheduler holds the pod until the IMEX daemon on {node} is ready: {now}"
            if last:
                text += f"; an earlier try failed: {last}"
            return text, fix_for(last or now, binding=True)
    return None
