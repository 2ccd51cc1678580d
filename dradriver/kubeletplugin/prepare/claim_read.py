"""A claim as prepare reads it: one GET, plain JSON (no model classes: the official
client's would drop the fields they do not know), its failures named by layer."""

from __future__ import annotations

from typing import Any

from dradriver.errors import ApiError, ClaimStateError
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin.state.records import ClaimRef

# Well inside the kubelet's call deadline, so that a hung API server is reported as such.
CLAIM_READ_TIMEOUT = 10.0


def read_claim(kube: Kube, ref: ClaimRef) -> dict[str, Any]:
    try:
        return kube.get(
            path_for("resource.k8s.io/v1", "resourceclaims", ref.namespace, name=ref.name),
            timeout=CLAIM_READ_TIMEOUT,
        )
    except NotFound as exc:
        raise ClaimStateError(
            f"claim {ref} not found in the API server", reason="not_found"
        ) from exc
    except KubeError as exc:
        raise ApiError(
            f"API layer: reading claim {ref} failed: {exc.message}", reason="api"
        ) from exc
