"""Unhealthy devices -> device taints in the published slices (pure).

A taint is `<driver>/unhealthy=<reason>:<effect>` with timeAdded the fault's first
moment, so rendering the same fault twice gives the same slice (and no write). NoSchedule
keeps new claims off the device; NoExecute also lets kube-controller-manager's
device-taint eviction controller evict the pods of claims that hold it (both need the
DRADeviceTaints gate; without it the API server drops the field)."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dradriver.health.model import Fault
from dradriver.slices.build import SliceContent

TAINT_NAME = "unhealthy"
TAINTS_DROPPED = (
    "slices layer: the API server dropped the device taints of unhealthy GPUs, so the "
    "scheduler may still hand them out: enable the DRADeviceTaints feature gate on "
    "kube-apiserver, kube-scheduler and kube-controller-manager. Publishing goes on "
    "without them."
)


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


def taint_key(driver: str) -> str:
    """`gpu.dradriver.io/unhealthy` for the default driver name: the driver's domain."""
    return f"{driver}/{TAINT_NAME}"


def rfc3339(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def taint(driver: str, fault: Fault, effect: TaintEffect) -> dict[str, Any]:
    return {
        "key": taint_key(driver),
        "value": fault.reason,
        "effect": str(effect),
        "timeAdded": rfc3339(fault.since),
    }


def with_taints(
    slices: Sequence[SliceContent],
    faults: Mapping[str, Fault],
    driver: str,
    *,
    effect: TaintEffect,
) -> list[SliceContent]:
    """The slices with a taint on every device named in `faults` (device name -> fault);
    slices without such a device are returned as they are."""
    if not faults:
        return list(slices)
    out: list[SliceContent] = []
    for s in slices:
        if not any(d["name"] in faults for d in s.devices):
            out.append(s)
            continue
        devices = tuple(
            {**d, "taints": [taint(driver, faults[d["name"]], effect)]}
            if d["name"] in faults
            else d
            for d in s.devices
        )
        out.append(replace(s, devices=devices))
    return out


def tainted(devices: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for d in devices if d.get("taints"))


def taints_dropped(sent: SliceContent, stored: Mapping[str, Any]) -> bool:
    """True when we sent taints and the API server kept none of them (gate off)."""
    if not tainted(sent.devices):
        return False
    return not tainted(stored.get("spec", {}).get("devices") or [])
