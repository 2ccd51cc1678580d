"""The fleet's picture from the report: a row per node, a cell per GPU in the state the
report counts it in, and the claims and pods holding each; a GPU carved into MIG
partitions shows the partitions in use."""

from __future__ import annotations

from collections import Counter

from dradriver.diagnose.fleet import fleet
from dradriver.diagnose.fleet_picture import picture
from dradriver.diagnose.world import build_world
from dradriver.inventory.node_devices import MigMode
from tests.support.explain import CLASSES, D, node, slices
from tests.support.fleet import claim, twelve


def test_the_twelve_node_fleet_is_72_allocated_and_24_stranded_cells() -> None:
    f = twelve()
    rows = picture(f.world, f.report, f.claims)
    assert [r.node for r in rows] == [f"n{i:02d}" for i in range(12)]
    assert all(len(r.cells) == 8 for r in rows)
    states = Counter(c.state for r in rows for c in r.cells)
    assert states == {"allocated": 72, "stranded": 24}
    first = rows[0].cells[0]
    assert first.claims == ("team/n00-a",) and first.pods == ("team/n00-train-a",)
    assert [c.state for c in rows[0].cells] == ["allocated"] * 6 + ["stranded"] * 2


def test_without_a_pending_claim_free_gpus_are_free_not_stranded() -> None:
    f = twelve(2)
    report = fleet(f.world, [])
    states = Counter(c.state for r in picture(f.world, report, f.claims) for c in r.cells)
    assert states == {"allocated": 12, "free": 4}


def test_a_gpu_in_mig_mode_shows_the_partition_in_use() -> None:
    """Dynamic MIG on a GPU already in MIG mode: published only as its partitions (every
    profile x placement); its cell is the GPU's, split into the partitions held."""
    s = slices("m", "1xA100-80GB:mig=on", MigMode.DYNAMIC)
    devices = [d for sl in s for d in sl["spec"]["devices"]]
    part = next(d["name"] for d in devices if "3g40gb" in d["name"])
    claims = [claim("half", 1, ("m", [part]), pod="infer")]
    classes = CLASSES
    w = build_world(s, classes, claims, nodes=[node("m")])
    (row,) = picture(w, fleet(w, []), claims)
    (cell,) = row.cells
    assert cell.state == "mig" and cell.device.startswith("GPU-")
    (p,) = cell.parts
    assert (p.profile, p.claims, p.pods) == ("3g.40gb", ("team/half",), ("team/infer",))
    assert s[0]["spec"]["driver"] == D
