"""Reading what explain and doctor judge from the API server: one list per kind, the
API server's feature gates from its /metrics, and a one-line error for each way this
can fail (no kubeconfig, API server down, no permission)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from dradriver.k8s import Kube, KubeconfigError, KubeError, path_for

Obj = Mapping[str, Any]
RES = "resource.k8s.io/v1"


class FactsError(Exception):
    """One line for the user: the layer that failed and what to do."""


def connect(kubeconfig: str | None) -> Kube:
    try:
        return Kube.from_kubeconfig(kubeconfig or os.environ.get("KUBECONFIG"))
    except KubeconfigError as exc:  # whatever the library's loaders refused, one line
        raise FactsError(
            f"kubeconfig: cannot load {kubeconfig or '~/.kube/config (or in-cluster)'}: "
            f"{str(exc).rstrip(' .')}. Fix: pass --kubeconfig or set KUBECONFIG"
        ) from exc


def items(kube: Kube, path: str, **query: Any) -> list[Obj]:
    try:
        return list(kube.list(path, **query).get("items", []))
    except KubeError as exc:
        raise _api_error(kube, path, exc) from exc


def get(kube: Kube, path: str) -> Obj:
    try:
        return kube.get(path, timeout=10)
    except KubeError as exc:
        if exc.status == 404:
            raise
        raise _api_error(kube, path, exc) from exc


def _api_error(kube: Kube, path: str, exc: KubeError) -> FactsError:
    if exc.status == 0:
        return FactsError(
            f"api-server: cannot reach {kube.host}: {exc.message.rstrip(' .')}. Fix: check "
            "that the API server runs and the kubeconfig points at it (kubectl cluster-info)"
        )
    if exc.status in (401, 403):
        return FactsError(
            f"api-server: not allowed to read {path} ({exc.status} {exc.message}). Fix: use "
            "a kubeconfig that may list ResourceSlices, ResourceClaims, DeviceClasses and Nodes"
        )
    return FactsError(f"api-server: GET {path} failed: {exc.status} {exc.message}")


_GATE = re.compile(r'^kubernetes_feature_enabled\{name="([^"]+)",stage="[^"]*"\} ([01])', re.M)


def feature_gates(kube: Kube) -> dict[str, bool]:
    """The API server's gates as its /metrics reports them; empty when not readable (the
    caller then says nothing about gates rather than guessing)."""
    try:
        text = kube.text("/metrics", timeout=10)
    except KubeError:
        return {}
    return {name: value == "1" for name, value in _GATE.findall(text)}


def cluster_lists(kube: Kube) -> dict[str, list[Obj]]:
    return {
        "slices": items(kube, path_for(RES, "resourceslices")),
        "classes": items(kube, path_for(RES, "deviceclasses")),
        "claims": items(kube, path_for(RES, "resourceclaims")),
        "nodes": items(kube, path_for("v1", "nodes")),
    }
