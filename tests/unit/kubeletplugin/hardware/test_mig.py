"""Dynamic MIG through the driver over the fake NVML library: carving at the allocated
placement, immediate rollback at every failing NVML step, recovery after a crash at every
step between intent and checkpoint, and the hardware always equal to the checkpoint."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver import crashpoints
from dradriver.errors import DriverError
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.ledger import Ledger, held_instances
from dradriver.nvml.library import open_nvml
from dradriver.nvml.mig import MigCarver
from dradriver.slices.build import build
from tests.support.crash import Crash, crash_at
from tests.support.mig_node import SPEC, Node, start_node
from tests.support.node import DRIVER, NODE, lose_checkpoint


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield start_node(tmp_path)
    crashpoints.hook = None


def test_two_3g_claims_share_a_gpu_at_placements_0_and_4(node: Node) -> None:
    a = node.claim("a", "gpu-0-mig-3g40gb-0")
    b = node.claim("b", "gpu-0-mig-3g40gb-4")
    (da,), (db,) = node.prepare(a), node.prepare(b)
    gpu0 = node.fake.machine.gpus[0]
    assert gpu0.mig_enabled  # switched on on demand (Hopper)
    assert {(gi.profile.name, gi.start) for gi in gpu0.gpu_instances.values()} == {
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    }
    assert da.uuid.startswith("MIG-") and da.uuid != db.uuid
    spec = (node.tmp / "cdi" / f"{DRIVER}-claim-{a.uid}.json").read_text()
    assert da.uuid in spec  # the container is told the MIG device, by UUID
    assert node.instances() == node.checkpoint_owned()
    node.unprepare(a)
    assert gpu0.mig_enabled  # b still has a MIG device there
    node.unprepare(b)
    assert gpu0.gpu_instances == {} and not gpu0.mig_enabled  # back as we found it


def test_whole_gpu_and_overlapping_partition_are_refused_while_carved(node: Node) -> None:
    node.prepare(node.claim("a", "gpu-1-mig-4g40gb-0"))
    with pytest.raises(DriverError, match="already prepared for claim team/a"):
        node.prepare(node.claim("whole", "gpu-1"))
    with pytest.raises(DriverError, match="already prepared"):
        node.prepare(node.claim("overlap", "gpu-1-mig-1g10gb-3"))
    node.prepare(node.claim("beside", "gpu-1-mig-2g20gb-4"))  # slices 4-5 are free
    assert len(node.instances()) == 2


CARVE_CALLS = [
    "nvmlDeviceGetMigMode",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceGetInfo_v2",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetUUID",
]


@pytest.mark.parametrize("call", CARVE_CALLS)
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_failure_at_any_nvml_step_leaves_no_instance(tmp_path: Path, call: str, nth: int) -> None:
    """The nth call of each NVML function in the carving path fails: with two devices
    in the claim, that covers the first device, the second (after the first exists) and
    calls past the end (then the prepare simply succeeds)."""
    node = start_node(tmp_path)
    ref = node.claim("two", "gpu-2-mig-1g10gb-0", "gpu-2-mig-2g20gb-4")
    node.fake.faults.fail_nth(call, nth, node.fake.pynvml.NVML_ERROR_UNKNOWN)
    try:
        node.prepare(ref)
        failed = False
    except DriverError as exc:
        failed = True
        assert "claim team/two" in str(exc) and "MIG layer" in str(exc), exc
        assert "NVMLError_Unknown" in str(exc)
    assert node.instances() == node.checkpoint_owned()
    if failed:
        assert node.instances() == set()
        assert node.driver.store.load().claims == {}
        assert not node.fake.machine.gpus[2].mig_enabled  # restored: we had turned it on
        assert list((tmp_path / "cdi").glob("*.json")) == []
        node.fake.faults.clear()
        node.prepare(ref)  # nothing stands in the way of the kubelet's retry
    assert len(node.instances()) == 2


def test_failure_message_names_device_placement_and_nvml_error(node: Node) -> None:
    nv = node.fake.pynvml
    node.fake.faults.fail_nth(
        "nvmlGpuInstanceCreateComputeInstance", 1, nv.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    with pytest.raises(DriverError) as err:
        node.prepare(node.claim("c", "gpu-3-mig-3g40gb-4"))
    msg = str(err.value)
    assert "placement 4" in msg and "InsufficientResources" in msg and "profile 9" in msg
    assert node.instances() == set()


def test_cdi_write_failure_rolls_back_the_carved_device(node: Node, monkeypatch: Any) -> None:
    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node.driver.executor.cdi_writer, "write", full)
    with pytest.raises(DriverError, match="No space left"):
        node.prepare(node.claim("c", "gpu-0-mig-1g10gb-3"))
    assert node.instances() == set() and node.driver.store.load().claims == {}


CRASHPOINTS = ["intent-recorded", "mig-before-create", "mig-created", "mig-recorded", "cdi-written"]


@pytest.mark.parametrize("point", CRASHPOINTS)
def test_a_crash_at_any_step_is_recovered_at_restart(tmp_path: Path, point: str) -> None:
    node = start_node(tmp_path)
    ref = node.claim("c", "gpu-0-mig-3g40gb-4")

    with crash_at(point), pytest.raises(Crash):
        node.prepare(ref)
    # A new process: NVML state is what the hardware kept, the checkpoint what was saved.
    again = start_node(tmp_path, node.claims)
    # The partition it intended is free again: the devices must be discovered anew.
    assert again.driver.reconcile() is True
    assert again.instances() == set(), f"stray instance after a crash at {point}"
    assert again.driver.store.load().claims == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []
    assert not again.fake.machine.gpus[0].mig_enabled
    (d,) = again.prepare(ref)  # and the claim can be prepared again
    assert again.instances() == {(d.carve.gpu_uuid, 9, 4)}
    # A restart with nothing interrupted changes nothing the devices depend on.
    assert start_node(tmp_path, node.claims).driver.reconcile() is False


def test_foreign_instances_are_left_alone_and_reported(node: Node) -> None:
    carver = MigCarver(node.fake.pynvml)
    gpu = node.fake.machine.gpus[3].uuid
    carver.set_mig_mode(gpu, True)
    carver.create(gpu, 9, 0, size=4, compute_slices=3)  # an admin's 3g at 0
    restarted = start_node(node.tmp, node.claims)
    restarted.driver.reconcile()
    assert len(restarted.instances()) == 1  # still there
    assert restarted.fake.machine.gpus[3].mig_enabled  # and its mode untouched
    # Publishing offers it as it is, and nothing that overlaps it.
    devs = restarted.driver.devices()
    assert devs[restarted.real("gpu-3-mig-3g40gb-0")].mig is not None
    assert restarted.real("gpu-3-mig-1g10gb-1") not in devs
    assert restarted.real("gpu-3-mig-3g40gb-4") in devs


def test_reboot_carves_prepared_partitions_again(tmp_path: Path) -> None:
    node = start_node(tmp_path)
    ref = node.claim("c", "gpu-1-mig-2g20gb-2")
    (before,) = node.prepare(ref)
    node.fake.machine.reboot()  # MIG instances do not survive it
    (tmp_path / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").unlink()  # nor does /var/run/cdi
    after_boot = start_node(tmp_path, node.claims, boot_id="boot-2")
    after_boot.driver.reconcile()
    rec = after_boot.driver.store.load().claims[ref.uid]
    assert after_boot.instances() == {(before.carve.gpu_uuid, 14, 2)}
    assert rec.devices[0].uuid != before.uuid  # a new MIG device, a new UUID
    spec = (tmp_path / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text()
    assert rec.devices[0].uuid in spec


def test_concurrent_prepares_on_different_gpus(node: Node) -> None:
    refs = [node.claim(f"c{i}", f"gpu-{i}-mig-7g80gb-0") for i in range(4)]
    errors: list[str] = []

    def go(ref: ClaimRef) -> None:
        r = node.driver.prepare([ref])[ref.uid]
        if r.error:
            errors.append(r.error)

    threads = [threading.Thread(target=go, args=(r,)) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(node.instances()) == 4 == len(node.checkpoint_owned())


def test_random_cycles_keep_hardware_equal_to_checkpoint(node: Node) -> None:
    rng = random.Random(7)
    names = [d for d in node.driver.devices() if "-mig-" in d]
    prepared: list[ClaimRef] = []
    for i in range(200):
        if prepared and rng.random() < 0.45:
            node.unprepare(prepared.pop(rng.randrange(len(prepared))))
        else:
            ref = node.claim(f"c{i}", rng.choice(names))
            try:
                node.prepare(ref)
                prepared.append(ref)
            except DriverError as exc:
                # Refused by our exclusivity check, or by NVML's own rules (a second
                # +me profile on a GPU): either way nothing may be left behind.
                assert "already prepared" in str(exc) or "InsufficientResources" in str(exc), exc
        assert node.instances() == node.checkpoint_owned(), f"diverged at step {i}"
    for ref in prepared:
        node.unprepare(ref)
    assert node.instances() == set()
    assert not any(g.mig_enabled for g in node.fake.machine.gpus)


def test_a_rollback_that_could_not_finish_is_finished_by_the_retry(
    node: Node, monkeypatch: Any
) -> None:
    """If destroying fails during a rollback, the record stays; the next prepare of the
    claim releases the leftovers first instead of losing track of them."""
    nv = node.fake.pynvml
    ref = node.claim("c", "gpu-0-mig-1g10gb-2")
    write = node.driver.executor.cdi_writer.write

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node.driver.executor.cdi_writer, "write", full)
    node.fake.faults.fail_nth("nvmlComputeInstanceDestroy", 1, nv.NVML_ERROR_IN_USE)
    with pytest.raises(DriverError, match="No space left"):
        node.prepare(ref)
    assert len(node.instances()) == 1  # could not be destroyed (in use) ...
    assert node.instances() == node.checkpoint_owned()  # ... so it stays recorded
    monkeypatch.setattr(node.driver.executor.cdi_writer, "write", write)
    (d,) = node.prepare(ref)  # the kubelet's retry: releases the leftover, carves anew
    assert node.instances() == node.checkpoint_owned()
    assert len(node.instances()) == 1 and d.uuid.startswith("MIG-")


def test_a_prepared_claim_outlives_a_driver_upgrade_that_renames_its_profile(node: Node) -> None:
    """GB200's 1g.23gb became 1g.24gb in a driver release: the device name published
    changes with it. A claim prepared before keeps working: it is answered and released
    from its record, not looked up by name again."""
    ref = node.claim("c", "gpu-1-mig-1g10gb-3")
    (before,) = node.prepare(ref)
    renamed = {name.replace("1g10gb", "1g11gb"): dev for name, dev in node.driver.devices().items()}
    node.driver.devices = lambda: renamed  # type: ignore[method-assign]
    (again,) = node.prepare(ref)  # the kubelet may ask again after a restart
    assert again == before
    node.unprepare(ref)
    assert node.instances() == set() and node.driver.store.load().claims == {}


def test_rtx_pro_media_engine_variants_are_carved_on_a_12_unit_grid(tmp_path: Path) -> None:
    """RTX PRO 6000: +me.all takes every media engine, -me none; 1g sits on units 0, 3, 6
    and 9 of a 12-unit grid. A plain 1g beside +me.all is what NVML refuses (the counters
    keep the scheduler from asking; tests/unit/fakenvml/test_mig_rules_nvidia.py): if asked
    anyway, the claim fails naming the device and NVML's reason, and nothing is left."""
    node = start_node(tmp_path, spec="1xRTX-PRO-6000")
    node.prepare(node.claim("all", "gpu-0-mig-1g24gbmeall-0"))
    node.prepare(node.claim("pure", "gpu-0-mig-1g24gbnome-3"))
    gpu0 = node.fake.machine.gpus[0]
    assert {(gi.profile.name, gi.start) for gi in gpu0.gpu_instances.values()} == {
        ("1g.24gb+me.all", 0),
        ("1g.24gb-me", 3),
    }
    with pytest.raises(DriverError, match=rf"{node.real('gpu-0-mig-1g24gb-6')}.*Insufficient"):
        node.prepare(node.claim("plain", "gpu-0-mig-1g24gb-6"))
    assert node.instances() == node.checkpoint_owned()
    assert len(node.instances()) == 2
    node.unprepare(node.ref("all"))
    node.prepare(node.ref("plain"))  # the engines are free again
    node.unprepare(node.ref("pure"))
    node.unprepare(node.ref("plain"))
    assert gpu0.gpu_instances == {} and not gpu0.mig_enabled


def test_a_lost_checkpoint_neither_leaks_nor_hands_out_a_mig_device(tmp_path: Path) -> None:
    """The checkpoint moved aside as corrupt while a partition is carved for a running
    pod: startup keeps the MIG device and its CDI spec (the pod may still use them), no
    other claim can be given it (it is not offered, not even as an existing device), its
    own claim prepared again gets it back, and the kubelet's unprepare of its claim
    destroys it and switches MIG mode back off."""
    node = start_node(tmp_path)
    a = node.claim("a", "gpu-0-mig-3g40gb-4")
    (first,) = node.prepare(a)
    lose_checkpoint(tmp_path)
    restarted = start_node(tmp_path, node.claims)
    restarted.driver.reconcile()
    gpu0 = restarted.fake.machine.gpus[0]
    assert [(gi.profile.name, gi.start) for gi in gpu0.gpu_instances.values()] == [("3g.40gb", 4)]
    assert (tmp_path / "cdi" / f"{DRIVER}-claim-{a.uid}.json").exists()
    inv = open_nvml(f"fake:{SPEC}", node=NODE, state_dir=tmp_path).discover().inventory
    ledger = Ledger.of(tmp_path)
    built = build(inv, MigMode.DYNAMIC, set(), held_mig=held_instances(ledger, set()))
    published = {d["name"] for sl in built.slices for d in sl.devices}
    assert not any(n.startswith(node.real("gpu-0-mig-3g40gb-4")) for n in published)
    assert node.real("gpu-0") not in published  # nor the whole GPU it sits on
    with pytest.raises(DriverError, match="held for claim UID"):
        restarted.prepare(restarted.claim("b", "gpu-0-mig-3g40gb-4"))
    # The kubelet, restarted too, prepares the same claim again: it gets its own MIG
    # device back, the one its pod uses (same UUID), not a new one.
    (again,) = restarted.prepare(a)
    assert again.uuid == first.uuid
    assert len(gpu0.gpu_instances) == 1
    restarted.unprepare(a)
    assert gpu0.gpu_instances == {} and not gpu0.mig_enabled
    assert not (tmp_path / "cdi" / f"{DRIVER}-claim-{a.uid}.json").exists()
    assert json.loads((tmp_path / "ledger.json").read_text())["migInstances"] == []


def test_a_read_only_cdi_directory_is_a_cdi_layer_error_with_a_clean_rollback(
    node: Node, monkeypatch: Any
) -> None:
    import errno

    from dradriver.kubeletplugin.prepare import cdi

    def read_only(*a: Any, **k: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(cdi, "atomic_write", read_only)
    ref = node.claim("c", "gpu-2-mig-1g10gb-3")
    r = node.driver.prepare([ref])[ref.uid]
    assert r.error.startswith("claim team/c: CDI layer: cannot write the spec")
    assert "must be writable by the plugin" in r.error and "--cdi-dir" in r.error
    gpu2 = node.fake.machine.gpus[2]
    assert gpu2.gpu_instances == {} and not gpu2.mig_enabled  # MIG mode back off
    assert node.driver.store.load().claims == {}
    ledger = json.loads((node.tmp / "ledger.json").read_text())
    assert ledger["migInstances"] == [] and gpu2.uuid not in ledger["migEnabled"]
