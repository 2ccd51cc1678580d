"""Pure claim checks and planning: the per-claim errors a user sees, and what we prepare."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.kubeletplugin.claims import ClaimError, ClaimRef, check_ref, plan

DRIVER, POOL = "gpu.dradriver.io", "node-a"
REF = ClaimRef("team", "0b5e8c3a-1111-2222-3333-444455556666", "train")
CFG = {"apiVersion": "gpu.dradriver.io/v1alpha1", "kind": "GpuConfig"}


def claim(
    results: list[dict[str, Any]] | None = None,
    *,
    uid: str = REF.uid,
    reserved: bool = True,
    configs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {"devices": {"results": results, "config": configs or []}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
    return {"metadata": {"uid": uid, "namespace": "team", "name": "train"}, "status": status}


def result(
    device: str, request: str = "gpus", driver: str = DRIVER, pool: str = POOL
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


@pytest.mark.parametrize(
    "ref, message",
    [
        (ClaimRef("team", "", "x"), "empty UID"),
        (ClaimRef("team", "../x", "x"), "not a Kubernetes UID"),
        (ClaimRef("team", REF.uid, "a/b"), "not a valid Kubernetes name"),
        (ClaimRef("..", REF.uid, "x"), "not a valid Kubernetes name"),
        (ClaimRef("team", REF.uid, ".hidden"), "not a valid Kubernetes name"),
        (ClaimRef("", REF.uid, "x"), "not a valid Kubernetes name"),
    ],
)
def test_refs_that_could_escape_or_mislead_are_refused(ref: ClaimRef, message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        check_ref(ref)


def test_replaced_claim() -> None:
    with pytest.raises(ClaimError, match=r"was replaced.*UID"):
        plan(claim([result("gpu-0")], uid="other"), REF, DRIVER, POOL)


def test_not_allocated_and_not_reserved() -> None:
    with pytest.raises(ClaimError, match="not allocated"):
        plan(claim(None), REF, DRIVER, POOL)
    with pytest.raises(ClaimError, match="not reserved for any pod"):
        plan(claim([result("gpu-0")], reserved=False), REF, DRIVER, POOL)


def test_only_our_results_and_our_pool() -> None:
    p = plan(claim([result("gpu-0"), result("nic-1", driver="net.example.com")]), REF, DRIVER, POOL)
    assert [d.device for d in p.devices] == ["gpu-0"]
    with pytest.raises(ClaimError, match="no device of driver"):
        plan(claim([result("nic-1", driver="net.example.com")]), REF, DRIVER, POOL)
    with pytest.raises(ClaimError, match="pool 'node-b'"):
        plan(claim([result("gpu-0", pool="node-b")]), REF, DRIVER, POOL)


def test_subrequest_suffix_is_stripped_for_the_kubelet() -> None:
    p = plan(claim([result("gpu-0", request="gpu/h100")]), REF, DRIVER, POOL)
    assert p.devices[0].request == "gpu/h100" and p.devices[0].request_name == "gpu"


def test_configs_in_precedence_order_per_request() -> None:
    cls = {
        "source": "FromClass",
        "requests": None,
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "class"}},
    }
    for_a = {
        "source": "FromClaim",
        "requests": ["a"],
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "claim-a"}},
    }
    for_sub = {
        "source": "FromClaim",
        "requests": ["b/h100"],
        "opaque": {"driver": DRIVER, "parameters": {**CFG, "tag": "claim-b-h100"}},
    }
    other = {
        "source": "FromClaim",
        "requests": None,
        "opaque": {"driver": "net.example.com", "parameters": {"x": 1}},
    }
    # The API server lists class configs first; we do not rely on it.
    p = plan(
        claim(
            [result("gpu-0", "a"), result("gpu-1", "b/h100"), result("gpu-2", "c")],
            configs=[for_a, other, cls, for_sub],
        ),
        REF,
        DRIVER,
        POOL,
    )
    tags = {d.device: [c["tag"] for c in d.configs] for d in p.devices}
    assert tags == {
        "gpu-0": ["class", "claim-a"],
        "gpu-1": ["class", "claim-b-h100"],
        "gpu-2": ["class"],
    }
