"""What explain and doctor say of the daemons' pods (diagnose/daemons.py), from plain
objects as the API server returns them."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.daemons import down, layer, needs, state
from dradriver.diagnose.doctor import State

UID = "c-uid"


def pod(name: str, node: str, labels: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "gpu-system",
            "name": name,
            "labels": {"app.kubernetes.io/component": "mps-daemon", **labels},
        },
        "spec": {"nodeName": node},
        "status": status,
    }


def running(restarts: int = 0) -> dict[str, Any]:
    return {"containerStatuses": [{"state": {"running": {}}, "restartCount": restarts}]}


def claim(
    results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team", "name": "job", "uid": UID},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


MPS_CONFIG = [
    {"opaque": {"driver": "gpu.dradriver.io", "parameters": {"sharing": {"strategy": "MPS"}}}}
]


def test_what_each_claim_depends_on() -> None:
    gpu = {"request": "r", "pool": "n1", "device": "gpu-0"}
    assert needs(claim([gpu])) == []
    assert needs(claim([gpu], MPS_CONFIG)) == [
        ("MPS control daemon", "n1", f"dradriver.io/claim-uid={UID}")
    ]
    share = {**gpu, "shareID": "s1"}
    assert needs(claim([share])) == [("MPS control daemon", "n1", "dradriver.io/device-name=gpu-0")]
    assert needs(claim([{**share, "adminAccess": True}])) == []
    channel = {"request": "c", "pool": "n2", "device": "imex-channel"}
    assert needs(claim([channel])) == [("IMEX daemon", "n2", f"dradriver.io/claim-uid={UID}")]


def test_explain_names_a_daemon_gone_or_not_serving_with_its_fix() -> None:
    c = claim([{"request": "r", "pool": "n1", "device": "gpu-0"}], MPS_CONFIG)
    mine = {"dradriver.io/claim-uid": UID}
    assert down([pod("mps-c-0", "n1", mine, **running())], [c]) is None
    what, fix = down([], [c]) or ("", "")
    assert "MPS control daemon claim team/job depends on has no pod on n1" in what
    assert "delete its pod" in fix and "restart the claim's pods" in fix
    crash = {
        "containerStatuses": [
            {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}
        ]
    }
    what, fix = down([pod("mps-c-0", "n1", mine, **crash)], [c]) or ("", "")
    assert "(pod gpu-system/mps-c-0 on n1) is not serving: CrashLoopBackOff: back-off 40s" in what
    assert "kubectl -n gpu-system logs mps-c-0" in fix
    # Another node's daemon of the same name label is not this claim's.
    assert down([pod("mps-c-0", "n9", mine, **running())], [c]) is not None


def test_doctor_lists_each_daemon_and_warns_of_one_that_does_not_serve() -> None:
    assert layer("n1", []) is None
    ok = layer("n1", [pod("mps-c-0", "n1", {"dradriver.io/claim-uid": UID}, **running(2))])
    assert ok is not None and ok.state is State.OK
    assert (
        "gpu-system/mps-c-0 (MPS control daemon, claim c-uid): running, restarted 2 times"
        in ok.text
    )
    gone = pod("mps-gpu-a", "n1", {"dradriver.io/device": "GPU-a"}, phase="Pending")
    warn = layer("n1", [gone])
    assert warn is not None and warn.state is State.WARN
    assert "a device's shares" in warn.text and "Pending, not started" in warn.text
    assert "describe pod mps-gpu-a" in warn.fix
    assert state({"metadata": {"deletionTimestamp": "x"}}) == (False, "being deleted")
