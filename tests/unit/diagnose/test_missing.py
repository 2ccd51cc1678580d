"""Why a pod's claim has no object: refused by an admission webhook at apply time (no
object, no event), or not generated from its template (the resourceclaim controller's
event on the pod). Webhook configurations and events as the API server returns them."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.explain import explain
from dradriver.diagnose.explain_report import ClaimRef
from dradriver.diagnose.missing import (
    checking_webhooks,
    creation_failures,
    missing_claim,
    missing_template,
    not_generated,
)
from dradriver.diagnose.world import World

NS_LABELS = {"kubernetes.io/metadata.name": "trial"}


def webhook_config(name: str, resources: list[str], namespaces: list[str] | None) -> Any:
    wh: dict[str, Any] = {
        "name": f"{name}.example.com",
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "resources": resources,
                "operations": ["CREATE", "UPDATE"],
            }
        ],
    }
    if namespaces is not None:
        wh["namespaceSelector"] = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
            ]
        }
    return {"metadata": {"name": name}, "webhooks": [wh]}


def test_the_webhooks_that_check_claims_in_the_namespace() -> None:
    configs = [
        webhook_config("ours", ["resourceclaims", "resourceclaimtemplates"], ["trial"]),
        webhook_config("elsewhere", ["resourceclaims"], ["other"]),
        webhook_config("pods", ["pods"], None),
        webhook_config("everything", ["*"], None),
    ]
    assert checking_webhooks(configs, "resourceclaims", NS_LABELS) == [
        "ours.example.com (ValidatingWebhookConfiguration ours)",
        "everything.example.com (ValidatingWebhookConfiguration everything)",
    ]
    # Without the namespace's labels, a namespace selector is taken to match.
    assert len(checking_webhooks(configs, "resourceclaims", None)) == 3
    update_only = webhook_config("upd", ["resourceclaims"], None)
    update_only["webhooks"][0]["rules"][0]["operations"] = ["UPDATE"]
    assert checking_webhooks([update_only], "resourceclaims", NS_LABELS) == []


def test_a_missing_claim_with_a_webhook_says_it_may_have_been_refused_and_how_to_see_it() -> None:
    """The issue's pod: its claim was refused at apply time, so it sits with no events."""
    hooks = ["claims.gpu.dradriver.io (ValidatingWebhookConfiguration dradriver)"]
    f = missing_claim("trial/bad-mps", "gpu", hooks)
    assert f.layer == "admission"
    assert f.message.startswith(
        "ResourceClaim trial/bad-mps (claim gpu of the pod) does not exist; it may have been "
        "refused when it was applied: the admission webhook claims.gpu.dradriver.io "
        "(ValidatingWebhookConfiguration dradriver) checks each ResourceClaim created here"
    )
    assert "no event, only the refusal in the output of `kubectl apply`" in f.message
    assert "`kubectl apply --dry-run=server -f FILE` shows it" in f.fix
    assert f.fix.endswith("or correct resourceClaimName in the pod")


def test_a_missing_claim_without_webhooks_or_unreadable_ones() -> None:
    none = missing_claim("trial/c", "gpu", [])
    assert (
        none.layer == "claim" and "no admission webhook checks a ResourceClaim here" in none.message
    )
    assert none.fix == "create it, or correct resourceClaimName in the pod"
    unknown = missing_claim("trial/c", "gpu", None)
    assert unknown.layer == "claim"
    assert "an admission webhook may have refused it" in unknown.message
    assert (
        "gpu.dradriver.io config is wrong" in unknown.message and "--dry-run=server" in unknown.fix
    )


def test_a_missing_template_names_the_template_and_its_field() -> None:
    f = missing_template("trial/t", "gpu", ["x (ValidatingWebhookConfiguration y)"])
    assert f.layer == "admission" and f.message.startswith("ResourceClaimTemplate trial/t")
    assert "each ResourceClaimTemplate created here" in f.message
    assert f.fix.endswith("or correct resourceClaimTemplateName in the pod")


def event(
    message: str, ts: str, count: int = 1, reason: str = "FailedResourceClaimCreation"
) -> Any:
    return {
        "type": "Warning",
        "reason": reason,
        "message": message,
        "count": count,
        "lastTimestamp": ts,
        "source": {"component": "resource_claim"},
    }


# What kube-controller-manager 1.34 records when the webhook refuses the generated claim,
# as the e2e catalogue saw it (the controller's claim has only a generateName, hence
# "ResourceClaim :"; the API server names it before calling the webhook).
DENIED = (
    'PodResourceClaim gpu: create ResourceClaim : admission webhook "claims.gpu.dradriver.io" '
    'denied the request: ResourceClaim "p-gpu-v4kkg": '
    "spec.devices.config[0].opaque.parameters.sharng: unknown field; did you mean sharing? "
    "(allowed here: apiVersion, kind, sharing)"
)


def test_a_generated_claim_the_webhook_refused_is_named_from_the_pods_event() -> None:
    events = [
        event("PodResourceClaim other: something else", "2026-01-01T00:00:09Z"),
        event(DENIED, "2026-01-01T00:00:05Z", count=4),
        event("PodResourceClaim gpu: older", "2026-01-01T00:00:01Z"),
        event("PodResourceClaim gpu: not this one", "2026-01-01T00:00:07Z", reason="Other"),
    ]
    assert [e["message"] for e in creation_failures(events, "gpu")] == [
        "PodResourceClaim gpu: older",
        DENIED,
    ]
    f = not_generated("trial/t", "gpu", events)
    assert f.layer == "admission"
    assert f.message == (
        "the resourceclaim controller could not create the pod's claim gpu from "
        "ResourceClaimTemplate trial/t (FailedResourceClaimCreation event on the pod, 4 times): "
        + DENIED.removeprefix("PodResourceClaim gpu: ")
    )
    assert "delete ResourceClaimTemplate trial/t and create it with the config corrected" in f.fix
    assert f.fix.endswith("then recreate the pod")


def test_a_generated_claim_not_made_for_another_reason_or_not_yet() -> None:
    other = not_generated("trial/t", "gpu", [event("PodResourceClaim gpu: quota", "t")])
    assert other.layer == "claim"
    assert other.message.endswith("(FailedResourceClaimCreation event on the pod): quota")
    assert other.fix.startswith("fix what the event names")
    waiting = not_generated("trial/t", "gpu", [])
    assert "has not been created from ResourceClaimTemplate trial/t yet" in waiting.message
    assert "kube-controller-manager" in waiting.fix


def test_explain_reports_the_missing_claims_finding_as_its_verdict() -> None:
    why = missing_claim("trial/bad-mps", "gpu", ["w (ValidatingWebhookConfiguration v)"])
    r = explain("pod trial/p", [ClaimRef("trial/bad-mps", None, why)], World())
    assert r.finding == why
    assert r.finding.line().startswith("admission: ResourceClaim trial/bad-mps (claim gpu")
    assert " Fix: apply the ResourceClaim's manifest again to see the refusal" in r.finding.line()
