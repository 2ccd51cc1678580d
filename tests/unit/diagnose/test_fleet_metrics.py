"""The fleet's Prometheus samples from the report `dradriver fleet` prints, on the issue's
twelve-node fleet (96 GPUs, 72 requested, 24 stranded) and a MIG node: the numbers are
the report's, labels never name a node or a pod, and the series a fleet costs do not
grow with its nodes."""

from __future__ import annotations

from dradriver.diagnose import fleet_metrics as fm
from tests.support.fleet import claim, pending_pod, twelve


def values(samples: list[fm.Sample], family: fm.Family) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.family is family}


def test_the_twelve_node_fleet_is_96_gpus_72_allocated_24_stranded() -> None:
    report = twelve().report
    groups = {f"n{i:02d}": ("a" if i < 6 else "b") for i in range(12)}
    samples = fm.gauges(report, groups)
    (product,) = report.totals
    gpus = values(samples, fm.GPUS)
    assert gpus[(product, "a", "allocated")] == gpus[(product, "b", "allocated")] == 36
    assert gpus[(product, "a", "free")] + gpus[(product, "b", "free")] == 24
    assert gpus[(product, "a", "tainted")] == 0  # zero, yet a series
    assert sum(gpus.values()) == 96
    stranded = values(samples, fm.STRANDED)
    assert stranded == {(product, "a", "too-few-free"): 12, (product, "b", "too-few-free"): 12}
    assert values(samples, fm.NODES) == {("a",): 6, ("b",): 6}
    fitting = values(samples, fm.FITTING)
    assert fitting[("2 GPUs", "a")] == 6 and fitting[("4 GPUs", "a")] == 0
    assert fitting[("2 NVLinked", "b")] == 6 and fitting[("8 NVLinked", "b")] == 0


def test_stranded_gpu_hours_accrue_with_time() -> None:
    report = twelve().report
    (product,) = report.totals
    hours = fm.accrue({}, report, {}, seconds=1800)
    assert hours == {(product, fm.NO_GROUP): 12.0}  # 24 GPUs for half an hour
    assert fm.accrue(hours, report, {}, seconds=900)[(product, fm.NO_GROUP)] == 18.0


def test_pending_claims_are_counted_by_what_explain_finds() -> None:
    f = twelve()
    claims, pods, w = f.claims, f.pods, f.world
    missing = {
        "metadata": {"name": "typo", "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.dradriver.oi"}}]
            }
        },
    }
    one = claim("one", 1)
    more = [pending_pod("typo", "typo"), pending_pod("one", "one")]
    reasons = fm.pending_reasons([*pods, *more], [*claims, missing, one], w)
    # The 4-GPU pod: no node has 4 free (explain says so at its allocation layer).
    assert reasons == {"allocation": 1, "deviceclass": 1, fm.FITS: 1}
    capped = fm.pending_reasons([*pods, *more], [*claims, missing, one], w, limit=1)
    assert capped == {"allocation": 1, fm.UNEXAMINED: 2}
    bound = dict(pending_pod("bound", "one"), spec={**more[1]["spec"], "nodeName": "n00"})
    assert fm.pending_reasons([bound], [*claims, one], w) == {}


def test_the_series_do_not_grow_with_the_fleet() -> None:
    small = fm.gauges(twelve(12).report, {})
    fleet = twelve(60)
    large = fm.gauges(fleet.report, {})
    assert len(small) == len(large)
    names = {n["metadata"]["name"] for n in fleet.nodes}
    for s in large:
        assert not names & set(s.labels), s  # no node in a label
