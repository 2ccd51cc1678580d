"""The walk a reader takes (issue Q21): a prepare and an unprepare of one claim, through the
real DRA servicer's translation into the real Preparer on fake NVML, counted as the
distinct modules of dradriver/ whose code runs. Each kind of claim has a budget; the counts
are printed (`pytest -s tests/unit/test_walk.py`). A budget is lowered as the path is
shortened; raising one needs its reason written beside it.

Q21's targets: 15 modules for a whole GPU, 22 for a dynamic-MIG partition, 20 for an
MPS-shared GPU, 22 for a share by memory; the budgets below are where the code stands."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from dradriver.api.gen.kubelet.dra.v1 import api_pb2 as v1
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.grpc_edge.servicers import Work, _DraCalls
from dradriver.slices.consumable import OFF, Consumable, parse_mode
from tests.support.gpu_names import names_of, real
from tests.support.local_daemons import LocalDaemons
from tests.support.node import allocated_claim, fake_preparer

MPS = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
# kind of claim -> (the most modules its walk may touch, Q21's target).
# Measured 2026-12-07: 25 -> 23 for a whole GPU (the daemons' pods and the steps a claim
# uses only), then 18 (the steps runner in execute.py, the name check in
# claim_devices.py, the refusals of a newer checkpoint in its codec, the journal in the
# checkpoint's store, a call's claims and the unprepares meanwhile in one module; the two
# ledgers one; modules first imported during the walk no longer counted). The MPS and
# share walks include the config's parsing (three modules of api/) and the daemon's pod
# spec.
# Then 14 (the state's records in one module, a claim's CDI spec in execute.py, a call's
# claims in preparer.py, the GPU locks in the ledger's module, the compute mode in
# nvml/host.py, the config's models in api/config.py, a name's GPU part beside the name's
# making in node_devices.py).
BUDGETS = {
    "whole GPU": (14, 15),
    "dynamic-MIG partition": (17, 22),
    "MPS-shared GPU": (20, 20),
    "share by memory": (21, 22),
}


def walk(
    tmp: Path, spec: str, device: str, *, mode: MigMode, consumable: Consumable = OFF, **kw: Any
) -> set[str]:
    """The modules of dradriver/ a prepare and an unprepare of one claim run."""
    claims: dict[str, Any] = {}
    preparer, _ = fake_preparer(
        tmp, spec, lambda ref: claims[ref.name], mode=mode, consumable=consumable
    )
    claims["walk"] = allocated_claim("walk", real(device, names_of(preparer.devices())), **kw)
    calls = _DraCalls(v1, preparer, Work(1, "walk"))
    meta = claims["walk"]["metadata"]
    claim = v1.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
    ran: set[str] = set()

    def seen(frame: FrameType, event: str, arg: object) -> None:
        # Functions only: a module's or class's body runs once, at its first import,
        # whichever test imports it first, and is not a step of the walk.
        if event == "call" and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("dradriver."):
                ran.add(module)

    sys.setprofile(seen)
    try:
        out = calls._prepare(v1.NodePrepareResourcesRequest(claims=[claim]))
        back = calls._unprepare(v1.NodeUnprepareResourcesRequest(claims=[claim]))
    finally:
        sys.setprofile(None)
    assert out.claims[meta["uid"]].error == "" and back.claims[meta["uid"]].error == ""
    return ran


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    LocalDaemons(tmp_path).stop_all()


@pytest.mark.parametrize(
    ("kind", "spec", "device", "mode", "extra"),
    [
        ("whole GPU", "2xH100-80GB", "gpu-0", MigMode.NONE, {}),
        ("dynamic-MIG partition", "2xH100-80GB", "gpu-0-mig-1g10gb-0", MigMode.DYNAMIC, {}),
        ("MPS-shared GPU", "2xH100-80GB", "gpu-0", MigMode.NONE, {"sharing": MPS}),
        ("share by memory", "2xH100-80GB", "gpu-0", MigMode.NONE, {"share": True}),
    ],
)
def test_the_walk_of_each_kind_of_claim_stays_within_its_budget(
    tmp: Path, kind: str, spec: str, device: str, mode: MigMode, extra: dict[str, Any]
) -> None:
    consumable = parse_mode("memory") if extra.get("share") else OFF
    ran = walk(tmp, spec, device, mode=mode, consumable=consumable, **extra)
    budget, target = BUDGETS[kind]
    print(f"\n{kind}: {len(ran)} modules (budget {budget}, Q21's target {target})")
    print("  " + "\n  ".join(sorted(ran)))
    assert len(ran) <= budget, sorted(ran)
    if kind == "whole GPU":
        # A whole GPU changes no hardware: nothing of MIG, sharing or shares runs for it.
        hardware = {m for m in ran if ".hardware." in m or m.endswith((".nvml.mig", ".ledger"))}
        assert hardware == set(), hardware
