"""Admission reviews of claims with a device config, as the API server sends them."""

from __future__ import annotations

import json
from typing import Any

from dradriver.controller import admission

DRIVER = "gpu.dradriver.io"
V = "gpu.dradriver.io/v1alpha1"


def claim_obj(params: Any, name: str = "train") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.io"}}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": params}}],
            }
        },
    }


BAD = {"apiVersion": V, "kind": "GpuConfig", "sharing": {"strategy": "Spatial"}}
GOOD = {"apiVersion": V, "kind": "GpuConfig"}


def review(
    obj: dict[str, Any] | None,
    *,
    kind: str = "ResourceClaim",
    group: str = "resource.k8s.io",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    name: str = "train",
) -> bytes:
    req: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
        "namespace": "team",
        "name": name,
        "operation": operation,
        "object": obj,
        "oldObject": old,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
    ).encode()


def answer(body: bytes) -> dict[str, Any]:
    req = admission.parse(body)
    return admission.response(req, admission.decide(req, DRIVER))
