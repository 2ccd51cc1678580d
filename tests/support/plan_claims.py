"""Allocated claims as plan() reads them, and a fake node of two H100s."""

from __future__ import annotations

from functools import cache
from typing import Any

from dradriver.inventory.node_devices import MigMode, offer
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.nvml.discover import discover
from fakenvml import load
from tests.support.gpu_names import names_of, real

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


# -- the whole plan: claim + node devices + checkpoint -> record ---------------------------------

MPS = {
    **CFG,
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}},
}


def h100_devices(mode: MigMode = MigMode.DYNAMIC) -> dict[str, Any]:
    fake = load("2xH100-80GB", node=POOL)
    fake.pynvml.nvmlInit()
    inv = discover(fake.pynvml).inventory
    return offer(inv, mode).devices()


@cache
def _h100_names() -> list[str]:
    return names_of(h100_devices())


def named(device: str) -> str:
    """The h100_devices() node's name for `device`, written by NVML index ("gpu-1")."""
    return real(device, _h100_names())


def with_config(results: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    cfg = {
        "source": "FromClaim",
        "requests": None,
        "opaque": {"driver": DRIVER, "parameters": params},
    }
    return claim(results, configs=[cfg])
