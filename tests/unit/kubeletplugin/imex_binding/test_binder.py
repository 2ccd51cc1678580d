"""The binder's decisions (kubeletplugin/imex_binding/plan.py), over claims as the API server
holds them: which wait for the node's IMEX daemon before their pod is bound, which keep
their daemons, and the status entry written for them."""

from __future__ import annotations

from typing import Any

from dradriver.api import computedomain as cd
from dradriver.kubeletplugin.imex_binding import plan
from dradriver.kubeletplugin.imex_binding.binder import _camel

DRIVER, NODE = "gpu.dradriver.io", "tray-1"


def claim(
    name: str,
    pool: str = NODE,
    binding: bool = True,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "channel",
        "driver": DRIVER,
        "pool": pool,
        "device": cd.CHANNEL_DEVICE,
    }
    if binding:
        result["bindingConditions"] = [cd.BINDING_CONDITION]
        result["bindingFailureConditions"] = [cd.BINDING_FAILURE]
    meta: dict[str, Any] = {"namespace": "team", "name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    if conditions is not None:
        status["devices"] = [
            {"driver": DRIVER, "pool": pool, "device": cd.CHANNEL_DEVICE, "conditions": conditions}
        ]
    return {"metadata": meta, "status": status}


def cond(kind: str, status: bool) -> dict[str, Any]:
    return plan.condition(kind, status, "R", message="m", now="2026-12-03T00:00:00Z")


def test_a_claim_waits_until_a_binding_condition_is_true() -> None:
    claims = [
        claim("new"),
        claim("said-false", conditions=[cond(cd.BINDING_CONDITION, False)]),
        claim("ready", conditions=[cond(cd.BINDING_CONDITION, True)]),
        claim("failed", conditions=[cond(cd.BINDING_FAILURE, True)]),
        # Allocated by a scheduler without the gates: prepare does the work.
        claim("plain", binding=False),
        claim("elsewhere", pool="tray-2"),
        claim("prepared"),
        claim("going", deleting=True),
        {"metadata": {"name": "unallocated", "namespace": "team", "uid": "u"}},
    ]
    got = plan.waiting(claims, DRIVER, NODE, prepared={"uid-prepared"})
    assert [w.ref.name for w in got] == ["new", "said-false"]
    assert got[0].said is None and got[1].said == cond(cd.BINDING_CONDITION, False)


def test_daemons_of_claims_allocated_or_prepared_here_are_kept() -> None:
    claims = [claim("a"), claim("b", binding=False), claim("c", pool="tray-2")]
    here = plan.allocated_here(claims, DRIVER, NODE)
    assert here == {"uid-a", "uid-b"}
    daemons = {"uid-a": 1, "uid-b": 2, "uid-gone": 3, "uid-prepared": 4}
    assert plan.to_sweep(daemons, here | {"uid-prepared"}) == ["uid-gone"]


def test_a_false_condition_is_written_again_only_when_it_says_something_new() -> None:
    said = plan.condition(
        cd.BINDING_CONDITION, False, "WaitingForNodes", message="1 of 2", now="t1"
    )
    assert plan.unchanged(
        said,
        plan.condition(cd.BINDING_CONDITION, False, "WaitingForNodes", message="1 of 2", now="t2"),
    )
    assert not plan.unchanged(
        said,
        plan.condition(cd.BINDING_CONDITION, False, "WaitingForNodes", message="2 of 3", now="t2"),
    )
    assert not plan.unchanged(None, said)


def test_the_status_entry_is_the_channel_device_of_this_node() -> None:
    c = claim("a")
    body = plan.status_body(plan.ref_of(c), DRIVER, NODE, conds=[cond(cd.BINDING_CONDITION, True)])
    assert body["metadata"] == {"name": "a", "namespace": "team", "uid": "uid-a"}
    (entry,) = body["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "imex-channel")
    assert entry["conditions"][0]["status"] == "True"
    # A condition message is at most 32768 characters (metav1.Condition).
    assert len(plan.condition("T", False, "R", message="x" * 40000, now="t")["message"]) == 32768


def test_reasons_are_condition_reasons() -> None:
    assert _camel("imex_not_ready") == "IMEXNotReady"
    assert _camel("imex_wrong_clique") == "IMEXWrongClique"
    assert _camel("config") == "Config"
