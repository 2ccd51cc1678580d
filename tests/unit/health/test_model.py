"""The health detector with plain values: every fault, the skip list, MIG inheritance,
instance-scoped XIDs, recovery after N clean probes, and the taints it publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.health.model import (
    DEFAULT_SKIP_XIDS,
    EccEvent,
    Fault,
    Health,
    HealthBook,
    HealthConfigError,
    Instance,
    Policy,
    Probe,
    XidEvent,
    device_health,
    parse_xids,
    unhealthy,
)
from dradriver.inventory.node_devices import MigMode
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import build
from dradriver.slices.taints import TaintEffect, taints_dropped, with_taints
from tests.support.gpu_names import names_of
from tests.support.inventory import inventory

G0, G1 = "GPU-0", "GPU-1"


def test_default_skip_list_is_the_device_plugins() -> None:
    assert {13, 31, 43, 45, 68, 109} == DEFAULT_SKIP_XIDS


@pytest.mark.parametrize("xid", sorted(DEFAULT_SKIP_XIDS))
def test_application_xids_change_nothing(xid: int) -> None:
    book = HealthBook()
    assert book.observe(XidEvent(G0, xid), now=100) is None
    assert book.get(G0).health is Health.HEALTHY


@pytest.mark.parametrize(
    ("obs", "reason"),
    [
        (XidEvent(G0, 79), "xid-79"),
        (XidEvent(G0, 48), "xid-48"),
        (XidEvent(G0, 94), "xid-94"),
        (EccEvent(G0), "ecc-dbe"),
        (Probe(G0, problem="lost"), "lost"),
        (Probe(G0, problem="row-remap-pending"), "row-remap-pending"),
        (Probe(G0, problem="retired-pages-pending"), "retired-pages-pending"),
    ],
)
def test_each_fault_makes_the_gpu_unhealthy(obs: object, reason: str) -> None:
    book = HealthBook()
    t = book.observe(obs, now=100)  # type: ignore[arg-type]
    assert t is not None and t.before.health is Health.HEALTHY
    assert t.after.health is Health.UNHEALTHY
    fault = book.get(G0).fault
    assert fault is not None and (fault.reason, fault.since) == (reason, 100)
    assert fault.xid == (int(reason[4:]) if reason.startswith("xid-") else None)
    assert book.get(G1).health is Health.HEALTHY  # only that GPU


def test_first_reason_is_kept_and_a_burst_is_one_change() -> None:
    book = HealthBook()
    assert book.observe(XidEvent(G0, 48), now=100) is not None
    assert book.observe(EccEvent(G0), now=101) is None
    assert book.observe(Probe(G0, problem="row-remap-pending"), now=102) is None
    assert book.get(G0).fault == Fault("xid-48", 100, 48)


def test_xid_79_names_the_cause_of_a_probes_lost_and_keeps_its_time() -> None:
    book = HealthBook()
    book.observe(Probe(G0, problem="lost"), now=100)
    t = book.observe(XidEvent(G0, 79), now=101)
    # A visible change: the taint's value becomes the driver's word for it.
    assert t is not None and t.before.fault == Fault("lost", 100)
    assert book.get(G0).fault == Fault("xid-79", 100, 79)
    # Only the XID that means "lost" does; the first reason stays for any other.
    book.observe(Probe(G1, problem="lost"), now=100)
    assert book.observe(XidEvent(G1, 48), now=101) is None
    assert book.get(G1).fault == Fault("lost", 100)
    # And a later probe's "lost" does not take it back.
    assert book.observe(Probe(G0, problem="lost"), now=102) is None
    assert book.get(G0).fault == Fault("xid-79", 100, 79)


def test_configured_skip_list() -> None:
    book = HealthBook(Policy(skip_xids=parse_xids("79, 48")))
    assert book.observe(XidEvent(G0, 79), now=1) is None
    assert book.observe(XidEvent(G0, 13), now=1) is not None  # no longer skipped


def test_bad_flags_name_the_flag() -> None:
    with pytest.raises(HealthConfigError, match="--health-skip-xids"):
        parse_xids("13,abc")
    with pytest.raises(HealthConfigError, match="--health-recovery-probes"):
        Policy(recovery_probes=0)
    assert parse_xids("") == frozenset()


def test_recovery_after_n_clean_probes_in_a_row() -> None:
    book = HealthBook(Policy(recovery_probes=3))
    book.observe(Probe(G0, problem="lost"), now=10)
    assert book.observe(Probe(G0), now=11) is None
    assert book.observe(Probe(G0), now=12) is None
    # A bad probe in between starts the count again.
    assert book.observe(Probe(G0, problem="lost"), now=13) is None
    assert book.observe(Probe(G0), now=14) is None
    assert book.observe(Probe(G0), now=15) is None
    t = book.observe(Probe(G0), now=16)
    assert t is not None and t.recovered and t.after.health is Health.HEALTHY
    assert book.gpus == {}


def test_probe_that_cannot_tell_is_unknown_and_counts_for_nothing() -> None:
    book = HealthBook(Policy(recovery_probes=1))
    t = book.observe(Probe(G0, unknown="NVMLError_Unknown"), now=1)
    assert t is not None and t.after.health is Health.UNKNOWN
    assert book.observe(Probe(G0), now=2) is not None  # back to Healthy
    book.observe(XidEvent(G0, 79), now=3)
    assert book.observe(Probe(G0, unknown="timeout"), now=4) is None  # still Unhealthy
    assert book.get(G0).health is Health.UNHEALTHY
    assert book.observe(Probe(G0), now=5) is not None
    assert book.get(G0).health is Health.HEALTHY


def test_mig_devices_inherit_their_parents_health() -> None:
    inv = inventory("2xH100-80GB")
    offer = build(inv, MigMode.DYNAMIC).offer
    uuid1 = inv.gpus[1].uuid
    book = HealthBook()
    book.observe(XidEvent(uuid1, 79), now=50)
    health = device_health(book, offer.devices().values())
    bad = unhealthy(health)
    gpus = names_of(inv)
    gpu1 = {n for n in health if n == gpus[1] or n.startswith(f"{gpus[1]}-")}
    assert set(bad) == gpu1 and len(gpu1) == 26  # the GPU and its 25 partitions
    assert all(f.reason == "xid-79" and f.since == 50 for f in bad.values())
    assert health[gpus[0]].health is Health.HEALTHY


def test_an_xid_naming_a_gpu_instance_stays_on_that_instance(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "gpus:\n- product: H100-80GB\n  mig: on\n  migDevices:\n"
        "  - {gpu: 0, profile: 3g.40gb, placement: 0}\n"
        "  - {gpu: 0, profile: 3g.40gb, placement: 4}\n"
    )
    inv = open_nvml(f"fake:@{fleet}", node="n", state_dir=None).discover().inventory
    offer = build(inv, MigMode.STATIC).offer
    gpu = inv.gpus[0]
    first = next(d for d in gpu.mig_devices if d.placement_start == 0)
    book = HealthBook()
    inst = Instance(first.profile_id, first.placement_start)
    assert book.observe(XidEvent(gpu.uuid, 94, instance=inst), now=7) is not None
    assert book.observe(XidEvent(gpu.uuid, 94, instance=inst), now=8) is None
    bad = unhealthy(device_health(book, offer.devices().values()))
    (name,) = bad
    assert offer.devices()[name].mig == first and bad[name].reason == "xid-94"
    # The GPU itself is healthy; a whole-GPU fault then covers every device.
    assert book.get(gpu.uuid).health is Health.HEALTHY
    book.observe(XidEvent(gpu.uuid, 79), now=9)
    assert len(unhealthy(device_health(book, offer.devices().values()))) == 2


def test_taints_on_the_unhealthy_devices_only() -> None:
    inv = inventory("2xL4")
    built = build(inv, MigMode.NONE)
    book = HealthBook()
    book.observe(XidEvent(inv.gpus[1].uuid, 79), now=1_700_000_000)
    faults = unhealthy(device_health(book, built.offer.devices().values()))
    (s,) = with_taints(built.slices, faults, "gpu.example.com", effect=TaintEffect.NO_EXECUTE)
    by_name = {d["name"]: d for d in s.devices}
    gpus = names_of(inv)
    assert "taints" not in by_name[gpus[0]]
    assert by_name[gpus[1]]["taints"] == [
        {
            "key": "gpu.example.com/unhealthy",
            "value": "xid-79",
            "effect": "NoExecute",
            "timeAdded": "2023-11-14T22:13:20Z",
        }
    ]
    # Same fault, same slice: no write when nothing changed.
    (again,) = with_taints(built.slices, faults, "gpu.example.com", effect=TaintEffect.NO_EXECUTE)
    assert again.fingerprint() == s.fingerprint() != built.slices[0].fingerprint()
    assert with_taints(built.slices, {}, "d", effect=TaintEffect.NO_SCHEDULE) == built.slices


def test_dropped_taints_are_noticed() -> None:
    inv = inventory("1xL4")
    built = build(inv, MigMode.NONE)
    faults = {names_of(inv)[0]: Fault("lost", 1)}
    (s,) = with_taints(built.slices, faults, "d", effect=TaintEffect.NO_SCHEDULE)
    dropped = {"spec": {"devices": [{k: v for k, v in s.devices[0].items() if k != "taints"}]}}
    kept = {"spec": {"devices": list(s.devices)}}
    assert taints_dropped(s, dropped) and not taints_dropped(s, kept)
    assert not taints_dropped(built.slices[0], dropped)  # nothing was tainted
