"""What explain says when selectors take no device: the CEL runtime error the scheduler
stops at (with the published name a selector most likely meant), and a DeviceClass that
matches no published device (its feature gate off, its driver publishing nothing, else
the condition that fails and the nearest miss). Apart from the walk (explain_request.py),
which only decides which step fails, because each of these weighs what is published to
say why."""

from __future__ import annotations

import re
from collections.abc import Sequence

from dradriver.diagnose.cel import Selector
from dradriver.diagnose.explain_report import Finding
from dradriver.diagnose.nearest import MissingName, explain_miss
from dradriver.diagnose.world import World

PARTITIONS_GATE = "DRAPartitionableDevices"

_GUARD = (
    "guard attributes some devices lack with has(...) (e.g. "
    'has(device.attributes["gpu.dradriver.io"].x) && ...), or fix the attribute name'
)


def runtime_error(message: str, miss: MissingName | None, published: int) -> Finding:
    """A selector's CEL runtime error, with the published name it most likely meant when
    it reads one that no device has (a typo, not a name some devices lack)."""
    if miss is None:
        return Finding("selector", message, _GUARD)
    if miss.holders:
        return Finding(
            "selector",
            f"{message}; {miss.holders} of {published} published devices have {miss.what}",
            _GUARD,
        )
    if miss.suggestion:
        return Finding(
            "selector",
            f"{message}; no published device has {miss.what}: did you mean {miss.suggestion}?",
            f"correct the name in the selector to {miss.suggestion}",
        )
    listed = (
        f"{miss.domain} publishes {miss.kind} {miss.names()}"
        if miss.published
        else f"no device publishes {miss.kind} under {miss.domain}"
    )
    return Finding(
        "selector", f"{message}; no published device has {miss.what}", f"{_GUARD} ({listed})"
    )


def joined(selectors: Sequence[Selector]) -> str:
    """Selectors as the one CEL expression they amount to (all must hold)."""
    if len(selectors) == 1:
        return selectors[0].expression
    return " && ".join(f"({s.expression})" for s in selectors) if selectors else "true"


def no_class_match(class_name: str, sels: Sequence[Selector], w: World) -> Finding:
    mig = any("mig" in s.expression.lower() for s in sels) or "mig" in class_name.lower()
    if mig and w.gates.get(PARTITIONS_GATE) is False:
        return Finding(
            "feature-gate",
            f"no MIG devices are published for DeviceClass {class_name}: dynamic MIG "
            f"partitions need the {PARTITIONS_GATE} feature gate, which is off on the "
            "API server, so the plugin does not publish them",
            f"enable {PARTITIONS_GATE} on kube-apiserver, kube-scheduler and "
            "kube-controller-manager, or run the plugin with --mig-mode static",
        )
    expr = joined(sels)
    drivers = sorted({d.driver for d in w.devices})
    for dr in _drivers_named(expr):
        if dr not in drivers:
            return Finding(
                "slices",
                f"no ResourceSlices from driver {dr} on any node (published: "
                f"{', '.join(drivers)}), so DeviceClass {class_name} matches nothing",
                "check that the kubelet plugin of that driver runs on the GPU nodes "
                "(`dradriver doctor --node NODE`)",
            )
    cond, miss = explain_miss(expr, w.devices)
    miss = f"; {miss}" if miss else ""
    return Finding(
        "deviceclass",
        f"0 of {len(w.devices)} published devices match DeviceClass {class_name} (`{cond}`){miss}",
        "pick the DeviceClass of the devices you want, or publish them (e.g. --mig-mode "
        "for MIG devices)",
    )


def _drivers_named(expr: str) -> list[str]:
    return re.findall(r'device\.driver\s*==\s*"([^"]+)"', expr)
