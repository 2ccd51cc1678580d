"""Per-GPU locking: hardware work on one GPU (carving a MIG device here) never holds up
a prepare or unprepare on another, and the guarantees of one-at-a-time stay: an
unprepare waits for the claim's work in progress and wins, a second prepare of a claim
in progress is refused for a retry, the other plugin instance neither undoes nor
repeats work in progress, and the shared ledger loses no entry when GPUs change at once.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.prepare.preparer import Prepared, Preparer
from dradriver.kubeletplugin.state.ledger import GpuLocks, Ledger, record_gpus
from dradriver.kubeletplugin.state.records import PREPARE_COMPLETED, owned_partitions
from dradriver.nvml.library import Nvml
from fakenvml.host import FakeHost
from tests.support.gpu_names import names_of, real
from tests.support.node import DRIVER, allocated_claim, fake_preparer, lose_checkpoint

SPEC = "4xH100-80GB"


@dataclass
class Node:
    tmp: Path
    claims: dict[str, dict[str, Any]]
    driver: Preparer
    nvml: Nvml
    names: list[str]  # the whole-GPU names, by NVML index, as discovery made them

    def ref(self, name: str, device: str, interval: str = "") -> ClaimRef:
        claim = self.claims.get(name) or allocated_claim(name, real(device, self.names))
        if interval:
            sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
            params = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": sharing}
            claim["status"]["allocation"]["devices"]["config"] = [
                {
                    "source": "FromClaim",
                    "requests": ["r"],
                    "opaque": {"driver": DRIVER, "parameters": params},
                }
            ]
        self.claims[name] = claim
        return ClaimRef("team", claim["metadata"]["uid"], name)

    def instances(self) -> set[tuple[str, int, int]]:
        return {
            (g.uuid, gi.profile.id, gi.start)
            for g in self.nvml.backend.machine.gpus
            for gi in g.gpu_instances.values()
        }

    def second_instance(self) -> Preparer:
        """The other plugin instance of a rolling update, on the same node and GPUs."""
        driver, _ = fake_preparer(self.tmp, SPEC, lambda ref: self.claims[ref.name], nvml=self.nvml)
        return driver


@pytest.fixture
def node(tmp_path: Path) -> Node:
    claims: dict[str, dict[str, Any]] = {}
    driver, nvml = fake_preparer(tmp_path, SPEC, lambda ref: claims[ref.name])
    return Node(tmp_path, claims, driver, nvml, names_of(driver.devices()))


class Gate:
    """Holds every carve on one GPU until opened: a carve that takes its time."""

    def __init__(self, driver: Preparer, gpu_index: int) -> None:
        assert driver.executor.mig is not None
        carver = driver.executor.mig.carver
        self.entered, self.opened = threading.Event(), threading.Event()
        real = carver.create
        uuid = next(d.gpu.uuid for d in driver.devices().values() if d.gpu.index == gpu_index)

        def create(gpu_uuid: str, *args: Any, **named: Any) -> Any:
            if gpu_uuid == uuid:
                self.entered.set()
                assert self.opened.wait(20), "the gate was never opened"
            return real(gpu_uuid, *args, **named)

        carver.create = create  # type: ignore[method-assign]

    def prepare(self, driver: Preparer, ref: ClaimRef) -> tuple[threading.Thread, dict[str, Any]]:
        """A prepare of `ref` in its own thread, once it has reached the held carve."""
        t, out = in_thread(lambda: driver.prepare([ref]))
        assert self.entered.wait(10)
        return t, out


@pytest.fixture
def gate(node: Node) -> Iterator[Gate]:
    g = Gate(node.driver, 0)
    yield g
    g.opened.set()


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(result=call()), daemon=True)
    t.start()
    return t, out


def prepared(r: dict[str, Prepared], ref: ClaimRef) -> Prepared:
    got = r[ref.uid]
    assert not got.error, got.error
    return got


def test_a_carve_on_one_gpu_does_not_hold_up_prepares_on_others(node: Node, gate: Gate) -> None:
    slow = node.ref("slow", "gpu-0-mig-1g10gb-0")
    waiting, _ = gate.prepare(node.driver, slow)
    # While GPU 0 carves: a partition on GPU 1, a whole GPU 2, and their unprepares.
    others = [node.ref("mig", "gpu-1-mig-3g40gb-4"), node.ref("whole", "gpu-2")]
    for ref in others:
        t, out = in_thread(lambda ref=ref: node.driver.prepare([ref]))
        t.join(10)
        assert not t.is_alive(), f"{ref.name} waited for GPU 0's carve"
        prepared(out["result"], ref)
    t, out = in_thread(lambda: node.driver.unprepare(others))
    t.join(10)
    assert not t.is_alive() and out["result"] == {r.uid: "" for r in others}
    assert waiting.is_alive()  # still carving
    gate.opened.set()
    waiting.join(10)
    cp = node.driver.store.load()
    assert list(cp.claims) == [slow.uid] and cp.claims[slow.uid].state == PREPARE_COMPLETED
    assert node.instances() == owned_partitions(cp)


def test_an_unprepare_waits_for_the_claims_work_in_progress_and_wins(
    node: Node, gate: Gate
) -> None:
    ref = node.ref("c", "gpu-0-mig-1g10gb-0")
    preparing, prep = gate.prepare(node.driver, ref)
    unpreparing, unprep = in_thread(lambda: node.driver.unprepare([ref]))
    unpreparing.join(0.3)
    assert unpreparing.is_alive(), "the unprepare did not wait for the carve"
    gate.opened.set()
    preparing.join(10)
    unpreparing.join(10)
    assert unprep["result"] == {ref.uid: ""}
    assert "was unprepared while this prepare worked on its GPUs" in prep["result"][ref.uid].error
    # Nothing left: no instance, no record, no spec, no ledger entry.
    assert node.instances() == set()
    assert node.driver.store.load().claims == {}
    assert not node.driver.executor.cdi_writer.exists(ref.uid)
    assert Ledger.of(node.tmp).load().instances == []


def test_a_second_prepare_of_a_claim_in_progress_is_refused_for_a_retry(
    node: Node, gate: Gate
) -> None:
    ref = node.ref("c", "gpu-0-mig-1g10gb-0")
    first, out = gate.prepare(node.driver, ref)
    again = node.driver.prepare([ref])[ref.uid]
    assert "still being prepared by an earlier call" in again.error
    gate.opened.set()
    first.join(10)
    devices = prepared(out["result"], ref).devices
    assert prepared(node.driver.prepare([ref]), ref).devices == devices  # the retry
    assert len(node.instances()) == 1


def test_the_other_instance_neither_undoes_nor_repeats_work_in_progress(
    node: Node, gate: Gate
) -> None:
    ref = node.ref("c", "gpu-0-mig-1g10gb-0")
    first, out = gate.prepare(node.driver, ref)
    other = node.second_instance()
    assert "still being prepared" in other.prepare([ref])[ref.uid].error
    # Its startup waits for the work in progress instead of undoing it as a crash's.
    starting, _ = in_thread(other.reconcile)
    starting.join(0.3)
    assert starting.is_alive()
    gate.opened.set()
    first.join(10)
    starting.join(10)
    assert not starting.is_alive()
    devices = prepared(out["result"], ref).devices
    assert prepared(other.prepare([ref]), ref).devices == devices
    cp = other.store.load()
    assert cp.claims[ref.uid].state == PREPARE_COMPLETED
    assert node.instances() == owned_partitions(cp) and len(cp.claims) == 1
    assert other.unprepare([ref]) == {ref.uid: ""}
    assert node.instances() == set()


def test_gpus_cycling_at_once_keep_hardware_checkpoint_and_ledgers_equal(node: Node) -> None:
    """Four threads, one per GPU, each preparing and unpreparing partitions, whole GPUs
    and time-sliced whole GPUs: the MIG and sharing ledgers change from four threads at
    once, and the fake host's record of time slices too."""
    profiles = ["1g10gb-0", "2g20gb-2", "3g40gb-4", "7g80gb-0"]
    errors: list[str] = []

    def cycle(gpu: int) -> None:
        rng = random.Random(gpu)
        for i in range(12):
            device = f"gpu-{gpu}-mig-{rng.choice(profiles)}" if i % 3 else f"gpu-{gpu}"
            ref = node.ref(f"g{gpu}-{i}", device, "Long" if i % 6 == 0 else "")
            r = node.driver.prepare([ref])[ref.uid]
            if r.error:
                errors.append(r.error)
                continue
            if node.driver.unprepare([ref])[ref.uid]:
                errors.append(f"unprepare {ref.name}")

    threads = [threading.Thread(target=cycle, args=(g,)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert node.instances() == set()
    assert node.driver.store.load().claims == {}
    ledger = Ledger.of(node.tmp).load()
    assert ledger.instances == [] and ledger.mig_enabled == set() and ledger.mig_disabled == {}
    assert not any(g.mig_enabled for g in node.nvml.backend.machine.gpus)
    assert ledger.claims() == set()
    host = node.nvml.host
    assert isinstance(host, FakeHost)
    # Every GPU got its Long interval, and was set back to Default (0) after.
    assert {g: r["timeslice"] for g, r in host.recorded().items()} == {
        g.uuid: 0 for g in node.nvml.backend.machine.gpus
    }


def test_ledger_changes_from_many_threads_are_all_kept(tmp_path: Path) -> None:
    ledger = Ledger.of(tmp_path)
    gpus = [f"GPU-{i:04d}" for i in range(16)]
    threads = [threading.Thread(target=ledger.mig_enabling, args=(g,)) for g in gpus]
    threads += [threading.Thread(target=ledger.slice_changing, args=(g, "c")) for g in gpus]
    random.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.load().mig_enabled == set(gpus)
    assert set(ledger.load().time_slice) == set(gpus)


def test_try_hold_never_waits_and_sees_every_other_holder(tmp_path: Path) -> None:
    locks, other = GpuLocks(tmp_path / "locks"), GpuLocks(tmp_path / "locks")
    with locks.hold(["GPU-b", "GPU-a"]):
        assert other.try_hold(["GPU-c", "GPU-a"]) is None  # another instance's files
        assert locks.try_hold(["GPU-a"]) is None  # another thread of this one
        held = other.try_hold(["GPU-c"])
        assert held is not None
        held.close()
    with other.try_hold(["GPU-a", "GPU-b", "GPU-c"]) or pytest.fail("free, yet not held"):
        pass


def test_a_records_gpus_are_what_its_hardware_work_touches(node: Node) -> None:
    ref = node.ref("c", "gpu-1-mig-1g10gb-0")
    prepared(node.driver.prepare([ref]), ref)
    rec = node.driver.store.load().claims[ref.uid]
    gpu1 = next(d.gpu.uuid for d in node.driver.devices().values() if d.gpu.index == 1)
    assert record_gpus(rec) == {gpu1}  # the parent, though the partition has its own UUID
    assert rec.devices[0].uuid and rec.devices[0].uuid.startswith("MIG-")


def test_a_forgotten_claims_unprepare_waits_for_its_gpus_too(node: Node) -> None:
    """A claim whose record was lost (a checkpoint moved aside) is released from what
    the ledgers hold for it: that hardware work takes the GPUs' locks like any other."""
    ref = node.ref("c", "gpu-0-mig-1g10gb-0")
    prepared(node.driver.prepare([ref]), ref)
    lose_checkpoint(node.tmp)
    restarted, _ = fake_preparer(
        node.tmp, SPEC, lambda r: node.claims[r.name], nvml=node.nvml, boot_id="boot-1"
    )
    gpu0 = next(d.gpu.uuid for d in node.driver.devices().values() if d.gpu.index == 0)
    other = GpuLocks(node.tmp / "locks")  # the other instance, at work on GPU 0
    with other.hold([gpu0]):
        t, out = in_thread(lambda: restarted.unprepare([ref]))
        t.join(0.3)
        assert t.is_alive(), "the forgotten claim's MIG device was destroyed under a lock"
        assert len(node.instances()) == 1
    t.join(10)
    assert out["result"] == {ref.uid: ""}
    assert node.instances() == set()
    assert Ledger.of(node.tmp).load().instances == []
