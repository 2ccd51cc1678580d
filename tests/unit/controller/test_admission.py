"""AdmissionReview in, decision, AdmissionReview out."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.controller import admission
from tests.support.admission import BAD, DRIVER, GOOD, answer, claim_obj, review


def test_refusal_shape_same_uid_422_invalid_and_the_field() -> None:
    out = answer(review(claim_obj(BAD)))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert resp["allowed"] is False
    assert resp["status"] == {
        "status": "Failure",
        "code": 422,
        "reason": "Invalid",
        "message": 'ResourceClaim "train": spec.devices.config[0].opaque.parameters.sharing.'
        "strategy: Input should be 'TimeSlicing' or 'MPS' (got 'Spatial')",
    }


def test_admitted_shape() -> None:
    out = answer(review(claim_obj(GOOD)))
    assert out["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_generate_name_objects_are_named_by_their_prefix() -> None:
    obj = claim_obj(BAD, name="")
    obj["metadata"] = {"generateName": "pod-gpu-", "namespace": "team"}
    msg = answer(review(obj, name=""))["response"]["status"]["message"]
    assert msg.startswith('ResourceClaim with generateName "pod-gpu-": spec.devices.config[0]')


def test_templates_are_checked() -> None:
    tpl = {"metadata": {"name": "t"}, "spec": {"spec": claim_obj(BAD)["spec"]}}
    resp = answer(review(tpl, kind="ResourceClaimTemplate", name="t"))["response"]
    assert resp["allowed"] is False
    assert resp["status"]["message"].startswith(
        'ResourceClaimTemplate "t": spec.spec.devices.config[0].opaque.parameters.sharing'
    )


@pytest.mark.parametrize(
    "kw, reason",
    [
        ({"kind": "Pod", "group": ""}, "/Pod is not checked here"),
        ({"group": "resource.example.com"}, "resource.example.com/ResourceClaim is not checked"),
        ({"kind": "DeviceClass"}, "resource.k8s.io/DeviceClass is not checked here"),
        ({"operation": "DELETE"}, "operation DELETE is not checked"),
    ],
)
def test_what_is_not_ours_is_admitted_unchecked(kw: dict[str, Any], reason: str) -> None:
    req = admission.parse(review(claim_obj(BAD), **kw))
    decision = admission.decide(req, DRIVER)
    assert decision.allowed and reason in decision.unchecked


def test_update_checks_only_changed_devices() -> None:
    # A claim admitted before the webhook existed can still lose its finalizer.
    old = claim_obj(BAD)
    new = claim_obj(BAD)
    new["metadata"]["finalizers"] = []
    decision = admission.decide(admission.parse(review(new, operation="UPDATE", old=old)), DRIVER)
    assert decision.allowed and decision.unchecked == "devices unchanged"
    changed = admission.decide(
        admission.parse(review(claim_obj(BAD), operation="UPDATE", old=claim_obj(GOOD))), DRIVER
    )
    assert not changed.allowed
    assert changed.problems[0].field == "spec.devices.config[0].opaque.parameters"


def test_another_driver_name_is_configurable() -> None:
    req = admission.parse(review(claim_obj(BAD)))
    assert admission.decide(req, "gpu.example.com").allowed


@pytest.mark.parametrize(
    "body, message",
    [
        (b"", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "v1beta1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request: missing"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "request.uid",
        ),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",'
            b' "request": {"uid": "u"}}',
            "request.kind",
        ),
        (review(None), "request.object: missing or not an object on CREATE"),
    ],
)
def test_malformed_reviews(body: bytes, message: str) -> None:
    with pytest.raises(admission.BadReview) as err:
        admission.parse(body)
    assert message in str(err.value)


def test_parameters_nested_thousands_deep_get_a_field_message() -> None:
    """The API server stores objects nested up to 10000 levels; the webhook answers them
    with the field that nests too deep, never a 500 or a dropped connection."""
    body = review(claim_obj({**GOOD, "x": "DEEP"}))
    body = body.replace(b'"DEEP"', b'{"a":' * 5000 + b"1" + b"}" * 5000)
    out = answer(body)["response"]
    assert out["allowed"] is False and out["status"]["code"] == 422
    assert "spec.devices.config[0].opaque.parameters.x.a.a" in out["status"]["message"]
    assert "nested more than" in out["status"]["message"]


def test_numbers_that_overflow_are_a_field_message() -> None:
    params = {
        **GOOD,
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "9" * 40}},
    }
    out = answer(review(claim_obj(params)))["response"]
    assert out["allowed"] is False
    assert "defaultPinnedDeviceMemoryLimit" in out["status"]["message"]
