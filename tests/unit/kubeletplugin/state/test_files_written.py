"""docs/design.md, "What the node writes", against the node: prepares of every kind on the
fake node (a whole GPU, a dynamic MIG partition, time-slicing, MPS, a share by memory)
leave in the state directory exactly the files and directories that section lists,
nothing it does not, and an uninstall's tidy knows each of them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.tidy import OWNED_DIRS, OWNED_FILE
from dradriver.slices.consumable import OFF, Consumable, parse_mode
from tests.support.gpu_names import names_of, real
from tests.support.local_daemons import LocalDaemons
from tests.support.node import allocated_claim, fake_preparer

DESIGN = Path(__file__).resolve().parents[4] / "docs" / "design.md"
# Listed, but written by no prepare: the health of GPUs (device_view/health.py), an
# IMEX daemon's directory (no fake node here runs a ComputeDomain: hardware/test_imex.py),
# and the fake GPUs' fault requests (written by a test or an admin, read by fakenvml).
NOT_BY_A_PREPARE = {"health.json", "imex/<ComputeDomain UID>/", "fake-nvml-<node>.requests"}
# The test's own, beside the plugin's state: the daemons' stand-in for pods, and the
# fake node's CDI directory (--cdi-dir, /var/run/cdi on a node).
RIG = re.compile(r"local-daemons\.(json|lock)|cdi(/.*)?")


def documented() -> dict[str, re.Pattern[str]]:
    """The paths the section lists under --state-dir, each as a pattern (a placeholder in
    <angle brackets> stands for one path component's worth; a trailing / a directory)."""
    section = DESIGN.read_text().split("\n## What the node writes\n", 1)[1].split("\n## ", 1)[0]
    listing = section.split("Under `--state-dir`", 1)[1].split("\n\n", 2)[1]
    paths: dict[str, re.Pattern[str]] = {}
    for item in re.split(r"\n- ", "\n" + listing):
        head = item.split("`: ", 1)[0] + "`"
        for path in re.findall(r"`([^`]+)`", head):
            regex = "".join(
                "[^/]+" if part.startswith("<") else re.escape(part)
                for part in re.split(r"(<[^>]+>)", path.rstrip("/"))
            )
            paths[path] = re.compile(regex)
    return paths


def prepare_each(
    state: Path, mode: MigMode, kinds: dict[str, tuple[str, dict[str, Any]]], consumable: Consumable
) -> None:
    claims: dict[str, Any] = {}
    preparer, _ = fake_preparer(
        state, "4xH100-80GB", lambda r: claims[r.name], mode=mode, consumable=consumable
    )
    names = names_of(preparer.devices())
    for kind, (device, extra) in kinds.items():
        claims[kind] = allocated_claim(kind, real(device, names), **extra)
        ref = ClaimRef("team", claims[kind]["metadata"]["uid"], kind)
        assert preparer.prepare([ref])[ref.uid].error == "", kind


def left_in(state: Path) -> set[str]:
    """What the plugin left: each file and directory, relative, but not inside a daemon's
    directories (tmpfs mounts: their content is the daemon's) nor the test's own."""
    out = set()
    for p in state.rglob("*"):
        rel = str(p.relative_to(state))
        if RIG.fullmatch(rel) or re.fullmatch(r"mps/[^/]+/.+", rel):
            continue
        out.add(rel)
    return out


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Path]]:
    states = [tmp_path / "mig", tmp_path / "shares"]
    yield states
    for state in states:
        LocalDaemons(state).stop_all()


def test_what_prepares_of_every_kind_leave_is_what_the_design_lists(nodes: list[Path]) -> None:
    mps = {"strategy": "MPS"}
    sliced = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    prepare_each(
        nodes[0],
        MigMode.DYNAMIC,
        {
            "whole": ("gpu-0", {}),
            "partition": ("gpu-1-mig-1g10gb-0", {}),
            "sliced": ("gpu-2", {"sharing": sliced}),
            "mps": ("gpu-3", {"sharing": mps}),
        },
        OFF,
    )
    prepare_each(
        nodes[1], MigMode.NONE, {"share": ("gpu-0", {"share": True})}, parse_mode("memory")
    )
    listed = documented()
    assert set(listed) >= NOT_BY_A_PREPARE
    left = left_in(nodes[0]) | left_in(nodes[1])
    parts = [p.rstrip("/").split("/") for p in listed]
    parents = {"/".join(path[:n]) for path in parts for n in range(1, len(path))}
    unlisted = sorted(
        rel
        for rel in left
        if rel not in parents and not any(r.fullmatch(rel) for r in listed.values())
    )
    assert unlisted == [], "written, but not in docs/design.md's list"
    unwritten = sorted(
        p
        for p, r in listed.items()
        if p not in NOT_BY_A_PREPARE and not any(r.fullmatch(rel) for rel in left)
    )
    assert unwritten == [], "in docs/design.md's list, but no prepare wrote it"
    # An uninstall's tidy removes each of them (and nothing else: tests of tidy.py).
    top = {rel.split("/")[0] for rel in left}
    assert sorted(t for t in top if not (OWNED_FILE.fullmatch(t) or t in OWNED_DIRS)) == []
