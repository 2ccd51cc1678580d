"""Whether the API server keeps a device's binding conditions: a dry-run create of a
slice with one, read back. What follows from either answer: docs/design.md, "IMEX
channels and daemons".
"""

from __future__ import annotations

from dradriver.api import computedomain as cd
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.imex_binding")


def api_keeps_binding_conditions(kube: Kube, driver: str, node: str) -> bool:
    device = {
        "name": cd.CHANNEL_DEVICE,
        "bindingConditions": [cd.BINDING_CONDITION],
        "bindingFailureConditions": [cd.BINDING_FAILURE],
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-binding-probe-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [device],
        },
    }
    path = path_for("resource.k8s.io/v1", "resourceslices")
    try:
        got = kube.request("POST", path, body=body, query={"dryRun": "All"}, timeout=10)
    except KubeError as exc:
        log.warning(
            "could not ask the API server about binding conditions; not using them",
            error=exc.message,
        )
        return False
    devices = (got.get("spec") or {}).get("devices") or [{}]
    return bool(devices[0].get("bindingConditions"))
