"""The MIG rules tested against NVIDIA, not against themselves.

Each row is a layout NVIDIA's documentation or a published `nvidia-smi` transcript shows
NVML accepting or refusing, with its source. Every row is checked three ways:
- the fake NVML's rules (fakenvml.mig_rules) accept or refuse it;
- the shared counters the driver publishes for that product (dradriver.slices.counters,
  built from what discovery reads through NVML) admit it or not, so the scheduler can
  never be handed a refused layout;
- an accepted layout, created on a fake GPU, is published by `dradriver devices` in static
  and dynamic MIG mode without error and without leaving the GPU out.

Sources:
- [G] NVIDIA MIG User Guide, "Supported MIG Profiles" (per-product tables: instance
  counts, engines);
- [GS] the guide's "Getting Started with MIG" (-cgi transcripts);
- [GO-CM] NVIDIA/gpu-operator assets/state-mig-manager/0400_configmap.yaml: the default
  mig-parted configurations (all-<profile>, all-balanced) NVIDIA applies to each product;
- [GH] kf-cuanschutz/NVIDIA_Grace_Hopper_benchmarking_logs_, "Lessons learned from the
  slurm MIG installation" (GH200 96GB transcripts);
- [SS] ssup2/blog-software, nvidia-gpu-sharing (A100-40GB, driver 580.126.09, -lgip Free
  counts after each -cgi);
- [RTX] "Slicing GPUs in Kubernetes with NVIDIA Multi-Instance GPU (MIG)", RTX PRO 6000
  Blackwell, driver 610.43.02 (-lgip/-lgipp and -cgi transcript);
- [CF] Colfax Research on H100 NVL: "ENC and OFA features are available only in the
  profile MIG 1g.12gb+me ... or in the profile MIG 7g.94gb ... These media engines cannot
  be shared across multiple MIG instances."
Rows marked "derived" follow from the engine columns of a real -lgip (a GPU has the
engines of its full profile) where NVIDIA states no layout in prose.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dradriver.cli import main
from dradriver.inventory.node_devices import Partition
from dradriver.slices import counters as ctr
from fakenvml import mig_rules, products
from tests.support.inventory import inventory

Want = tuple[str, int | None]  # profile name, placement start (None: NVML picks)


@dataclass(frozen=True)
class Row:
    product: str
    layout: tuple[Want, ...]
    accepted: bool
    source: str

    def __str__(self) -> str:
        shown = ",".join(f"{n}@{s}" if s is not None else n for n, s in self.layout)
        return f"{self.product}:{shown}:{'ok' if self.accepted else 'refused'}"


def _n(name: str, count: int) -> tuple[Want, ...]:
    return ((name, None),) * count


def _eight_slice_rows(key: str, source_note: str = "") -> list[Row]:
    """What [G] and [GO-CM] say of every 8-slice product: each profile alone up to its
    instance count, the balanced layout, and the limits."""
    p = products.PRODUCTS[key]
    one, me, one2, two, three, four, seven = (g.name for g in p.gi_profiles)
    cm = "[GO-CM] all-" + source_note
    return [
        Row(key, _n(one, 7), True, f"{cm}{one}; [G] 7 instances"),
        Row(key, _n(one2, 4), True, f"{cm}{one2}; [G] 4 instances"),
        Row(key, _n(two, 3), True, f"{cm}{two}; [G] 3 instances"),
        Row(key, _n(three, 2), True, f"{cm}{three}; [G] 2 instances"),
        Row(key, _n(four, 1), True, f"{cm}{four}"),
        Row(key, _n(seven, 1), True, f"{cm}{seven}"),
        Row(key, _n(one, 2) + _n(two, 1) + _n(three, 1), True, "[GO-CM] all-balanced"),
        Row(key, _n(one, 8), False, "[G] 7 instances of " + one),
        Row(key, _n(three, 3), False, "[G] 2 instances of " + three),
        Row(key, _n(seven, 1) + _n(one, 1), False, "[G] 7g takes the full GPU"),
        Row(key, _n(me, 2), False, "[G] 'A single 1g profile can include media extensions'"),
        Row(key, _n(me, 1) + _n(one, 6), True, "[G] one +me beside 1g instances"),
        Row(key, ((four, 0), (three, 4)), True, "[G] Concepts: 4g+3g supported since R510"),
        Row(key, ((four, 0), (two, 4), (one, 6)), True, "[SS] 4g@0 then 2g@4 (-lgi)"),
    ]


ROWS: list[Row] = [
    # -- A100 ---------------------------------------------------------------------------
    *_eight_slice_rows("A100-40GB"),
    Row(
        "A100-40GB",
        (("3g.20gb", 4), ("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2)),
        True,
        "[GS] Example 2: -cgi 9,19,14,19 placed 3g 4:4, 1g 0:1 and 1:1, 2g 2:2",
    ),
    *_eight_slice_rows("A100-80GB"),
    # -- A30: 4 memory and 4 compute slices -------------------------------------------
    Row("A30", _n("1g.6gb", 4), True, "[GO-CM] all-1g.6gb; [G] 4 instances"),
    Row("A30", _n("2g.12gb", 2), True, "[GO-CM] all-2g.12gb; [G] 2 instances"),
    Row("A30", _n("4g.24gb", 1), True, "[GO-CM] all-4g.24gb"),
    Row("A30", _n("1g.6gb", 2) + _n("2g.12gb", 1), True, "[GO-CM] all-balanced"),
    Row("A30", _n("1g.6gb", 5), False, "[G] 4 instances of 1g.6gb"),
    Row("A30", _n("1g.6gb+me", 2), False, "[G] 'A single 1g profile can include media ext.'"),
    Row("A30", _n("1g.6gb+me", 1) + _n("1g.6gb", 3), True, "[G] one +me beside 1g instances"),
    Row("A30", _n("2g.12gb+me", 1) + _n("1g.6gb", 2), True, "[G] one 2g+me beside 1g instances"),
    Row(
        "A30",
        _n("2g.12gb+me", 1) + _n("1g.6gb+me", 1),
        False,
        "derived: -lgip 4g.24gb has 1 JPEG and 1 OFA; each +me profile takes them",
    ),
    # -- Hopper -------------------------------------------------------------------------
    *_eight_slice_rows("H100-80GB"),
    Row(
        "H100-80GB",
        _n("3g.40gb", 1) + _n("1g.10gb", 2),
        True,
        "[G] R570 example: MIG 1c.3g.40gb Device 0-2 and MIG 1g.10gb Device 3-4",
    ),
    *_eight_slice_rows("H100-NVL"),
    Row("H100-NVL", _n("1g.12gb+me", 1) + _n("7g.94gb", 1), False, "[CF] ENC/OFA not shared"),
    *_eight_slice_rows("GH200-96GB"),
    Row("GH200-96GB", _n("1g.12gb+me", 3), False, "[GH] -cgi 20,20,20: Insufficient Resources"),
    Row("GH200-96GB", _n("1g.24gb", 3), True, "[GH] -cgi 15,15,15 -C"),
    *_eight_slice_rows("GH200-144GB"),
    *_eight_slice_rows("H200-141GB"),
    *_eight_slice_rows("H200-NVL"),
    *_eight_slice_rows("H20"),
    # -- Blackwell ----------------------------------------------------------------------
    *_eight_slice_rows("B200"),
    *_eight_slice_rows("GB200"),
    *_eight_slice_rows("B300"),
    # RTX PRO 6000: 12-unit grid, 4 compute slices, 4 NVDEC/NVENC/JPEG and 1 OFA.
    Row(
        "RTX-PRO-6000",
        (("2g.48gb", 0), ("1g.24gb", 6), ("1g.24gb", 9)),
        True,
        "[RTX] -cgi 2g.48gb,1g.24gb,1g.24gb placed 0:6, 6:3, 9:3",
    ),
    Row("RTX-PRO-6000", _n("1g.24gb", 4), True, "[RTX] -lgip 1g.24gb 4/4"),
    Row("RTX-PRO-6000", _n("1g.24gb+gfx", 4), True, "[RTX] -lgip 1g.24gb+gfx 4/4"),
    Row("RTX-PRO-6000", _n("1g.24gb-me", 4), True, "[RTX] -lgip 1g.24gb-me 4/4"),
    Row("RTX-PRO-6000", _n("2g.48gb", 2), True, "[RTX] -lgip 2g.48gb 2/2"),
    Row("RTX-PRO-6000", _n("4g.96gb", 1), True, "[RTX] -lgip 4g.96gb 1/1"),
    Row("RTX-PRO-6000", _n("1g.24gb", 5), False, "[G] at most 4 instances"),
    Row("RTX-PRO-6000", _n("1g.24gb+me", 2), False, "[RTX] -lgip 1g.24gb+me 1/1"),
    Row("RTX-PRO-6000", _n("1g.24gb+me.all", 2), False, "[RTX] -lgip 1g.24gb+me.all 1/1"),
    Row(
        "RTX-PRO-6000",
        _n("1g.24gb+me.all", 1) + _n("1g.24gb", 1),
        False,
        "derived: [G] '+me.all: Allocates all available media engines'; 4g has 4 NVDEC",
    ),
    Row(
        "RTX-PRO-6000",
        _n("2g.48gb+me.all", 1) + _n("1g.24gb+me", 1),
        False,
        "derived: one OFA (4g.96gb row), taken by +me.all",
    ),
    Row(
        "RTX-PRO-6000",
        _n("1g.24gb+me.all", 1) + _n("1g.24gb-me", 3),
        True,
        "derived: [G] '-me: Excludes all media engines' beside +me.all",
    ),
    Row(
        "RTX-PRO-6000",
        _n("2g.48gb+me.all", 1) + _n("2g.48gb-me", 1),
        True,
        "derived: as above, 2g",
    ),
    Row(
        "RTX-PRO-6000",
        _n("1g.24gb+me", 1) + _n("1g.24gb", 3),
        True,
        "derived: 4 NVDEC for four 1g instances, the OFA for the +me one",
    ),
]


def test_every_mig_product_has_rows() -> None:
    covered = {r.product for r in ROWS}
    assert covered == {k for k, p in products.PRODUCTS.items() if p.mig_capable}


def _placements(
    product: products.Product, layout: tuple[Want, ...], ok=lambda placed: True
) -> Iterator[list[mig_rules.Placed]]:
    """The ways of placing the layout's instances (fixed starts kept) that `ok` accepts at
    every step: instances of one profile take distinct starts in increasing order, and a
    prefix `ok` refuses is not extended (both rule sets are monotone)."""
    fixed: list[mig_rules.Placed] = []
    free: dict[str, int] = {}
    for name, start in layout:
        gi = product.gi_profile_by_name(name)
        assert gi is not None, f"{product.key} has no profile {name}"
        if start is None:
            free[name] = free.get(name, 0) + 1
        else:
            fixed.append((gi, start))
    groups = [
        [
            list(zip([gi] * k, starts, strict=True))
            for starts in itertools.combinations(gi.placement_starts, k)
        ]
        for name, k in free.items()
        if (gi := product.gi_profile_by_name(name)) is not None
    ]

    def walk(i: int, placed: list[mig_rules.Placed]) -> Iterator[list[mig_rules.Placed]]:
        if i == len(groups):
            yield placed
            return
        for option in groups[i]:
            if ok([*placed, *option]):
                yield from walk(i + 1, [*placed, *option])

    if ok(fixed):
        yield from walk(0, fixed)


def _nvml_accepts(row: Row) -> list[mig_rules.Placed] | None:
    product = products.PRODUCTS[row.product]
    return next(_placements(product, row.layout, mig_rules.admissible), None)


def _counters_admit(row: Row) -> bool:
    product = products.PRODUCTS[row.product]
    gpu = inventory(f"1x{row.product}").gpus[0]
    design = ctr.design(gpu.mig_profiles)

    def ok(placed: list[mig_rules.Placed]) -> bool:
        used: dict[str, int] = {}
        for gi, start in placed:
            profile = gpu.profile(gi.name)
            assert profile is not None
            for c, v in design.consumption[Partition(profile, start)].items():
                used[c] = used.get(c, 0) + v
        return all(v <= design.capacities[c] for c, v in used.items())

    return next(_placements(product, row.layout, ok), None) is not None


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_the_fake_nvml_rules_agree_with_nvidia(row: Row) -> None:
    assert (_nvml_accepts(row) is not None) == row.accepted, row.source


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_the_published_counters_agree_with_nvidia(row: Row) -> None:
    assert _counters_admit(row) == row.accepted, row.source


def _devices(spec: Path, mode: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["devices", "--devices", f"fake:@{spec}", "--mig-mode", mode, "-o", "json"])
    assert rc == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("row", [r for r in ROWS if r.accepted], ids=str)
def test_an_accepted_layout_is_created_and_published(tmp_path: Path, row: Row) -> None:
    placed = _nvml_accepts(row)
    assert placed is not None
    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "product": row.product,
                        "mig": True,
                        "migDevices": [
                            {"gpu": 0, "profile": gi.name, "placement": start}
                            for gi, start in placed
                        ],
                    }
                ]
            }
        )
    )
    for mode in ("static", "dynamic"):
        doc = _devices(spec, mode)
        assert doc["skipped"] == [], (mode, doc["skipped"])
        devices = [d for s in doc["resourceSlices"] for d in s["spec"]["devices"]]
        existing = [d for d in devices if "uuid" in d["attributes"]]
        assert len(existing) == len(placed), mode
        if mode == "dynamic":
            # Beside instances it did not make, every partition offered must still fit.
            _check_offered_partitions_fit(row, placed, doc)


def _check_offered_partitions_fit(row: Row, placed: list[mig_rules.Placed], doc: dict) -> None:
    product = products.PRODUCTS[row.product]
    (counted,) = [s for s in doc["resourceSlices"] if s["spec"].get("sharedCounters")]
    caps = {c: int(v["value"]) for c, v in counted["spec"]["sharedCounters"][0]["counters"].items()}
    for d in counted["spec"]["devices"]:
        if "consumesCounters" not in d:
            continue
        demand = {c: int(v["value"]) for c, v in d["consumesCounters"][0]["counters"].items()}
        fits = all(v <= caps[c] for c, v in demand.items())
        profile = d["attributes"]["profile"]["string"]
        gi = product.gi_profile_by_name(profile)
        assert gi is not None
        start = int(d["name"].rsplit("-", 1)[1])  # gpu-0-mig-3g20gb-4: placed at 4
        nvml_ok = mig_rules.admissible([*placed, (gi, start)])
        assert fits == nvml_ok, (d["name"], fits, nvml_ok)


# [SS]: A100-40GB, -lgip "Free" after -cgi 4g.20gb (placed 0:4), then after 2g.10gb (4:2).
FREE_AFTER = [
    (
        [("4g.20gb", 0)],
        {"1g.5gb": 3, "1g.10gb": 2, "2g.10gb": 1, "3g.20gb": 1, "4g.20gb": 0, "7g.40gb": 0},
    ),
    ([("4g.20gb", 0), ("2g.10gb", 4)], {"1g.5gb": 1}),
]


@pytest.mark.parametrize(("layout", "free"), FREE_AFTER)
def test_free_counts_match_a_real_a100(tmp_path: Path, layout, free: dict[str, int]) -> None:
    """NVML's Free column, from the rules and from the counters the driver publishes
    beside the same instances (made by someone else, so taken from the counter set)."""
    product = products.A100_40GB
    placed = [(product.gi_profile_by_name(n), s) for n, s in layout]
    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "product": product.key,
                        "mig": True,
                        "migDevices": [{"gpu": 0, "profile": n, "placement": s} for n, s in layout],
                    }
                ]
            }
        )
    )
    doc = _devices(spec, "dynamic")
    (counted,) = [s for s in doc["resourceSlices"] if s["spec"].get("sharedCounters")]
    caps = {c: int(v["value"]) for c, v in counted["spec"]["sharedCounters"][0]["counters"].items()}
    for name, count in free.items():
        gi = product.gi_profile_by_name(name)
        assert gi is not None
        assert mig_rules.remaining_capacity(placed, gi) == count, name  # type: ignore[arg-type]
        demands = [
            {c: int(v["value"]) for c, v in d["consumesCounters"][0]["counters"].items()}
            for d in counted["spec"]["devices"]
            if d["attributes"].get("profile", {}).get("string") == name and "consumesCounters" in d
        ]
        assert _most_that_fit(demands, caps) == count, name


def _most_that_fit(demands: list[dict[str, int]], caps: dict[str, int]) -> int:
    best = 0
    for k in range(len(demands), 0, -1):
        for combo in itertools.combinations(demands, k):
            used: dict[str, int] = {}
            for d in combo:
                for c, v in d.items():
                    used[c] = used.get(c, 0) + v
            if all(v <= caps[c] for c, v in used.items()):
                return k
    return best
