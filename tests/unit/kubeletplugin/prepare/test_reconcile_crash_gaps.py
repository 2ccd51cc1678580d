"""The node state's crash gaps (issue Q10, item 7): a MIG instance is owned from the moment
it can exist, a rollback that cannot finish leaves its leftovers recorded for the retry,
the unprepare or the next start, a checkpoint path that is not a file is moved aside,
and the claims of a lost checkpoint undo what the ledgers hold for them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import DriverError
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.ledger import Ledger
from tests.support.crash import Crash, crash_at
from tests.support.gpu_names import fake_names, real
from tests.support.mig_node import SPEC, Node, start_node
from tests.support.node import NODE, lose_checkpoint
from tests.support.sharing_node import Node as SharingNode

SHARING_SPEC = "2xH100-80GB"  # test_sharing's node
# The NVML calls of a carve after which an instance exists that only its placement names.
CARVE_CALLS = [
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceGetInfo",
]


def dev(name: str, spec: str = SPEC) -> str:
    """An index-style device name ("gpu-0-mig-1g10gb-3") as the node publishes it."""
    return real(name, fake_names(spec, NODE))


def kill_after(node: Node, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL right after NVML answers `call` (the first time): nothing else runs."""
    module = node.driver.executor.mig.carver.nvml  # type: ignore[union-attr]
    real: Callable[..., Any] = getattr(module, call)

    def then_die(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise Crash(call)

    monkeypatch.setattr(module, call, then_die)


def ledger_instances(tmp: Path) -> list[Any]:
    return Ledger.of(tmp).load().instances


@pytest.mark.parametrize("call", CARVE_CALLS)
def test_a_kill_inside_the_carve_leaves_an_instance_startup_destroys(
    tmp_path: Path, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = start_node(tmp_path)
    ref = node.claim("c", dev("gpu-0-mig-1g10gb-3"))
    kill_after(node, call, monkeypatch)
    with pytest.raises(Crash):
        node.prepare(ref)
    monkeypatch.undo()
    assert len(node.instances()) == 1  # made, and no ID of it recorded anywhere
    again = start_node(tmp_path, node.claims)
    assert again.driver.reconcile() is True
    assert again.instances() == set(), f"instance left after a kill after {call}"
    assert again.driver.store.load().claims == {} and ledger_instances(tmp_path) == []
    assert not again.fake.machine.gpus[0].mig_enabled
    # reconcile() said the partitions changed: the plugin discovers (and publishes) anew.
    fresh = start_node(tmp_path, node.claims)
    (d,) = fresh.prepare(ref)
    assert fresh.instances() == {(d.carve.gpu_uuid, d.carve.profile_id, 3)}


@pytest.mark.parametrize("point", ["mig-intent-ledgered", "mig-gi-created", "mig-ci-created"])
def test_a_crash_point_inside_the_carve_is_recovered(tmp_path: Path, point: str) -> None:
    node = start_node(tmp_path)
    ref = node.claim("c", dev("gpu-1-mig-2g20gb-2"))

    with crash_at(point), pytest.raises(Crash):
        node.prepare(ref)
    again = start_node(tmp_path, node.claims)
    again.driver.reconcile()
    assert again.instances() == set() and ledger_instances(tmp_path) == []
    assert again.driver.store.load().claims == {}
    fresh = start_node(tmp_path, node.claims)  # discovered anew, as after any reconcile
    fresh.prepare(ref)
    assert len(fresh.instances()) == 1


def test_a_kill_inside_the_carve_then_a_lost_checkpoint_hands_the_instance_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No record says the carve began (the checkpoint is lost too): the ledger's intent
    makes the instance the claim's, kept and not offered, given back to the claim when it
    is prepared again and destroyed by its unprepare."""
    node = start_node(tmp_path)
    ref = node.claim("a", dev("gpu-0-mig-3g40gb-4"))
    kill_after(node, "nvmlComputeInstanceGetInfo", monkeypatch)
    with pytest.raises(Crash):
        node.prepare(ref)
    monkeypatch.undo()
    lose_checkpoint(tmp_path)
    again = start_node(tmp_path, node.claims)
    again.driver.reconcile()
    gpu0 = again.fake.machine.gpus[0]
    (gi,) = gpu0.gpu_instances.values()
    (owned,) = ledger_instances(tmp_path)
    assert owned.claim == ref.uid and owned.gpu_instance_id is not None
    with pytest.raises(DriverError, match="held for claim UID"):
        again.prepare(again.claim("b", dev("gpu-0-mig-3g40gb-4")))
    (d,) = again.prepare(ref)
    assert d.carve.gpu_instance_id == owned.gpu_instance_id and len(gpu0.gpu_instances) == 1
    assert list(gpu0.gpu_instances.values()) == [gi]
    again.unprepare(ref)
    assert gpu0.gpu_instances == {} and not gpu0.mig_enabled
    assert ledger_instances(tmp_path) == []


def half_made_claim(node: Node, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Creating the compute instance fails, and destroying the new GPU instance fails
    twice (NVML's own cleanup in the carve, then the rollback): the claim fails with a
    half-made GPU instance on GPU 2."""
    nv = node.fake.pynvml
    ref = node.claim("c", dev("gpu-2-mig-1g10gb-0"))
    node.fake.faults.fail_nth("nvmlGpuInstanceCreateComputeInstance", 1, nv.NVML_ERROR_UNKNOWN)
    node.fake.faults.fail_nth("nvmlGpuInstanceDestroy", 1, nv.NVML_ERROR_IN_USE)
    node.fake.faults.fail_nth("nvmlGpuInstanceDestroy", 2, nv.NVML_ERROR_IN_USE)
    with pytest.raises(DriverError, match="creating the compute instance"):
        node.prepare(ref)
    assert len(node.instances()) == 1  # the rollback could not finish ...
    assert node.instances() == node.checkpoint_owned()  # ... so it stays recorded
    assert [i.claim for i in ledger_instances(node.tmp)] == [ref.uid]
    return ref


def test_a_rollback_that_could_not_finish_is_finished_by_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = start_node(tmp_path)
    ref = half_made_claim(node, monkeypatch)
    (d,) = node.prepare(ref)  # the kubelet's retry: the leftover goes, the carve succeeds
    assert d.uuid.startswith("MIG-") and len(node.instances()) == 1
    assert node.instances() == node.checkpoint_owned()
    node.unprepare(ref)
    assert node.instances() == set() and not node.fake.machine.gpus[2].mig_enabled


def test_an_unprepare_never_answers_success_while_its_instance_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = start_node(tmp_path)
    ref = half_made_claim(node, monkeypatch)
    nv = node.fake.pynvml
    node.fake.faults.fail_nth("nvmlGpuInstanceDestroy", 1, nv.NVML_ERROR_IN_USE)
    err = node.driver.unprepare([ref])[ref.uid]
    assert "MIG layer" in err and "the kubelet retries" in err
    assert len(node.instances()) == 1 and node.instances() == node.checkpoint_owned()
    assert node.driver.unprepare([ref]) == {ref.uid: ""}  # the retry
    gpu2 = node.fake.machine.gpus[2]
    assert gpu2.gpu_instances == {} and not gpu2.mig_enabled
    assert node.driver.store.load().claims == {} and ledger_instances(tmp_path) == []


def test_a_rollback_that_could_not_finish_is_finished_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = start_node(tmp_path)
    ref = half_made_claim(node, monkeypatch)
    again = start_node(tmp_path, node.claims)
    again.driver.reconcile()
    assert again.instances() == set() and not again.fake.machine.gpus[2].mig_enabled
    assert again.driver.store.load().claims == {} and ledger_instances(tmp_path) == []
    start_node(tmp_path, node.claims).prepare(ref)


def test_a_checkpoint_path_that_is_a_directory_is_moved_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = start_node(tmp_path)
    ref = node.claim("c", dev("gpu-3-mig-1g10gb-0"))
    node.prepare(ref)
    main = tmp_path / "checkpoint.json"
    main.unlink()
    main.mkdir()  # a mistaken volume mount
    (main / "something").write_text("x")
    again = start_node(tmp_path, node.claims)  # its first load: no crash
    again.driver.reconcile()  # and its first save
    assert main.is_file()
    (aside,) = tmp_path.glob("checkpoint.json.corrupt-*")
    assert aside.is_dir() and (aside / "something").read_text() == "x"
    assert "NOT A REGULAR FILE" in caplog.text
    # Empty; the ledger still knows the instance, released by the unprepare.
    assert again.driver.store.load().claims == {}
    again.unprepare(ref)
    assert again.instances() == set() and not again.fake.machine.gpus[3].mig_enabled
    store = CheckpointStore(main, "boot-1")
    store.save(store.load())  # a plain save works on the regular file made again


def test_claims_of_a_lost_checkpoint_undo_what_the_ledgers_hold(tmp_path: Path) -> None:
    node = SharingNode(tmp_path)
    nv = node.fake.pynvml
    mps = [node.claim("m0", dev("gpu-0", SHARING_SPEC), {"strategy": "MPS"})]
    carved = node.claim("k", dev("gpu-1-mig-1g10gb-0", SHARING_SPEC), None)
    for ref in mps:
        node.prepare(ref)
    node.prepare(carved)
    assert len(node.daemons()) == 1
    assert node.mode(0) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    lose_checkpoint(tmp_path)
    restarted = SharingNode(tmp_path)
    restarted.claims = node.claims
    restarted.driver.reconcile()
    assert restarted.driver.store.load().claims == {}
    out = restarted.driver.unprepare([*mps, carved])
    assert out == {r.uid: "" for r in [*mps, carved]}
    assert restarted.daemons() == []
    assert restarted.mode(0) == nv.NVML_COMPUTEMODE_DEFAULT
    gpu1 = restarted.fake.machine.gpus[1]
    assert gpu1.gpu_instances == {} and not gpu1.mig_enabled
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["computeMode"] == {} and "mpsDaemons" not in ledger
    assert restarted.driver.store.load().claims == {}


def test_a_time_slice_of_a_lost_checkpoint_is_restored(tmp_path: Path) -> None:
    node = SharingNode(tmp_path)
    ref = node.claim(
        "t",
        dev("gpu-1", SHARING_SPEC),
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    )
    node.prepare(ref)
    uuid1 = node.fake.machine.gpus[1].uuid
    assert node.sharing.recorded()[uuid1] == {"timeslice": 3}
    lose_checkpoint(tmp_path)
    restarted = SharingNode(tmp_path)
    restarted.claims = node.claims
    restarted.driver.reconcile()
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}
    assert restarted.sharing.recorded()[uuid1] == {"timeslice": 0}
    assert json.loads((tmp_path / "ledger.json").read_text())["timeSlice"] == {}
    assert os.listdir(tmp_path / "cdi") == []
