"""Why a pod's claim has no ResourceClaim object, and where to see it: a claim or template
an admission webhook refused at `kubectl apply` (which leaves no object and no event, only
the refusal in the output of whoever applied it), or a claim the resourceclaim controller
could not generate from its template (kube-controller-manager records that as a
FailedResourceClaimCreation event on the pod). Pure: the caller reads the objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver.diagnose.explain_report import Finding

Obj = Mapping[str, Any]

# kube-controller-manager's resourceclaim controller (pkg/controller/resourceclaim,
# syncPod): one Warning on the pod per failed try, "PodResourceClaim <name>: <error>".
CREATION_FAILED = "FailedResourceClaimCreation"
_DENIED = "denied the request"


def _selects(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against a namespace's labels;
    an absent or empty selector selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key", ""), e.get("operator", ""), e.get("values") or []
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op, False)
        if not ok:
            return False
    return True


def _covers(rule: Obj, resource: str) -> bool:
    def has(field: str, want: str) -> bool:
        return bool({want, "*"} & set(rule.get(field) or []))

    return (
        has("apiGroups", "resource.k8s.io")
        and has("resources", resource)
        and has("operations", "CREATE")
    )


def checking_webhooks(
    configs: Sequence[Obj], resource: str, namespace_labels: Mapping[str, str] | None
) -> list[str]:
    """The validating webhooks that check a create of `resource` ("resourceclaims",
    "resourceclaimtemplates") in a namespace with these labels (None: not readable, so
    every namespace selector is taken to match), as "webhook (ValidatingWebhookConfiguration
    name)"."""
    out = []
    for cfg in configs:
        cfg_name = (cfg.get("metadata") or {}).get("name", "")
        for wh in cfg.get("webhooks") or []:
            if not any(_covers(r, resource) for r in wh.get("rules") or []):
                continue
            if namespace_labels is not None and not _selects(
                wh.get("namespaceSelector"), namespace_labels
            ):
                continue
            out.append(f"{wh.get('name', '?')} (ValidatingWebhookConfiguration {cfg_name})")
    return out


def _refused_text(kind: str, webhooks: Sequence[str] | None) -> tuple[str, str]:
    """(layer, why) for an object of `kind` that does not exist."""
    if webhooks is None:
        return "claim", (
            f"; if it was applied, an admission webhook may have refused it (dradriver's "
            f"refuses a {kind} whose gpu.dradriver.io config is wrong), which leaves no object "
            "and no event: the refusal is only in the output of `kubectl apply`"
        )
    if not webhooks:
        return "claim", (
            f" (no admission webhook checks a {kind} here, so none refused it: it was never "
            "created, or it was deleted)"
        )
    return "admission", (
        f"; it may have been refused when it was applied: the admission webhook "
        f"{', '.join(webhooks)} checks each {kind} created here, and one it refuses leaves no "
        "object and no event, only the refusal in the output of `kubectl apply`"
    )


def _see_refusal(kind: str, field: str) -> str:
    return (
        f"apply the {kind}'s manifest again to see the refusal (`kubectl apply "
        "--dry-run=server -f FILE` shows it without creating anything), correct the config "
        f"field it names and apply it; or correct {field} in the pod"
    )


def missing_claim(claim: str, entry: str, webhooks: Sequence[str] | None) -> Finding:
    """The pod names ResourceClaim `claim` (namespace/name), which does not exist.
    `webhooks`: those that check ResourceClaims there; None when they cannot be read."""
    layer, why = _refused_text("ResourceClaim", webhooks)
    fix = (
        "create it, or correct resourceClaimName in the pod"
        if webhooks == []
        else _see_refusal("ResourceClaim", "resourceClaimName")
    )
    return Finding(
        layer, f"ResourceClaim {claim} (claim {entry} of the pod) does not exist{why}", fix
    )


def missing_template(template: str, entry: str, webhooks: Sequence[str] | None) -> Finding:
    """The pod's claim `entry` is made from ResourceClaimTemplate `template`, which does
    not exist."""
    layer, why = _refused_text("ResourceClaimTemplate", webhooks)
    fix = (
        "create it, or correct resourceClaimTemplateName in the pod"
        if webhooks == []
        else _see_refusal("ResourceClaimTemplate", "resourceClaimTemplateName")
    )
    return Finding(
        layer,
        f"ResourceClaimTemplate {template} (claim {entry} of the pod) does not exist{why}",
        fix,
    )


def creation_failures(events: Sequence[Obj], entry: str) -> list[Obj]:
    """The controller's FailedResourceClaimCreation events for the pod's claim `entry`,
    newest last."""
    prefix = f"PodResourceClaim {entry}:"
    found = [
        e
        for e in events
        if e.get("reason") == CREATION_FAILED and str(e.get("message", "")).startswith(prefix)
    ]
    return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def not_generated(template: str, entry: str, events: Sequence[Obj]) -> Finding:
    """The pod's claim `entry` has no ResourceClaim yet though its template exists: the
    controller's last event for it says why, or it has not got to it yet."""
    failed = creation_failures(events, entry)
    if not failed:
        return Finding(
            "claim",
            f"the pod's claim {entry} has not been created from ResourceClaimTemplate "
            f"{template} yet, and no {CREATION_FAILED} event on the pod says why",
            "wait a moment; if it stays, check that kube-controller-manager runs (its "
            "resourceclaim controller creates the claim, and records on the pod why it "
            "cannot)",
        )
    last = failed[-1]
    detail = " ".join(str(last.get("message", "")).split()).removeprefix(
        f"PodResourceClaim {entry}: "
    )
    count = int(last.get("count") or 1)
    times = f", {count} times" if count > 1 else ""
    said = (
        f"the resourceclaim controller could not create the pod's claim {entry} from "
        f"ResourceClaimTemplate {template} ({CREATION_FAILED} event on the pod{times}): {detail}"
    )
    if _DENIED in detail:
        return Finding(
            "admission",
            said,
            f"the template was stored before the webhook checked it, and every claim made "
            f"from it is refused: delete ResourceClaimTemplate {template} and create it with "
            "the config corrected as the refusal says (a template's spec cannot be changed), "
            "then recreate the pod",
        )
    return Finding(
        "claim",
        said,
        "fix what the event names; the controller retries (`kubectl describe pod` shows "
        "the events)",
    )
