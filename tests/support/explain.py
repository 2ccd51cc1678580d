"""A cluster as `dradriver explain` reads it: nodes, their slices, claims and pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dradriver.diagnose.explain import explain
from dradriver.diagnose.explain_report import ClaimRef, Report
from dradriver.diagnose.world import build_world
from dradriver.inventory.node_devices import MigMode
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import build
from dradriver.slices.publish import render

D = "gpu.dradriver.io"
REPO = Path(__file__).resolve().parents[2]
CLASSES = list(yaml.safe_load_all((REPO / "deploy" / "deviceclasses.yaml").read_text()))


def slices(node: str, spec: str, mode: MigMode = MigMode.NONE) -> list[dict[str, Any]]:
    found = open_nvml(f"fake:{spec}", node=node, state_dir=None).discover()
    return render(D, node, build(found.inventory, mode).slices)


def node(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
    }


def claim(
    name: str,
    selector: str = "",
    count: int = 1,
    device_class: str = D,
    allocated: list[tuple[str, str]] | None = None,
    node_name: str = "n1",
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    c: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    if allocated:
        c["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": D, "pool": pool, "device": dev}
                        for pool, dev in allocated
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "values": [node_name]}]}
                    ]
                },
            }
        }
    return c


def pod(name: str, claim_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}], **spec},
        "status": {"phase": "Pending"},
    }


def run(
    c: dict[str, Any],
    all_slices: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    others: list[dict[str, Any]] = (),  # type: ignore[assignment]
    p: dict[str, Any] | None = None,
    gates: dict[str, bool] | None = None,
) -> Report:
    world = build_world(all_slices, CLASSES, [c, *others], nodes=nodes, gates=gates)
    return explain("x", [ClaimRef("default/" + c["metadata"]["name"], c)], world, pod=p)


def line(r: Report) -> str:
    assert r.finding is not None, "expected a finding"
    return r.finding.line()
