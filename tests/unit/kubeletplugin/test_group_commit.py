"""Group commit: prepares and unprepares that arrive together share one checkpoint save,
and none is answered before the save that holds it; a failed save fails (and undoes)
exactly the claims it held."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dradriver.inventory.node_devices import MigMode
from dradriver.k8s import KubeError
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.group_commit import GroupCommit
from dradriver.kubeletplugin.state.records import Checkpoint
from tests.support.gpu_names import fake_names
from tests.support.node import NODE, allocated_claim, fake_preparer


def node(tmp_path: Path, n: int) -> tuple[Any, list[ClaimRef]]:
    claims: dict[str, dict[str, Any]] = {}
    refs = []
    gpus = fake_names(f"{n}xH100-80GB", NODE)  # by NVML index
    for i in range(n):
        c = allocated_claim(f"c{i}", gpus[i])
        claims[c["metadata"]["uid"]] = c
        refs.append(ClaimRef("team", c["metadata"]["uid"], f"c{i}"))
    preparer, _ = fake_preparer(
        tmp_path, f"{n}xH100-80GB", lambda r: claims[r.uid], mode=MigMode.NONE
    )
    preparer.executor.mig = None  # whole GPUs, MIG mode none: every claim is simple
    return preparer, refs


def slow_saves(preparer: Any, delay: float, log: list[set[str]]) -> None:
    """Each save takes `delay` (a slow disk) and records which claims it made durable."""
    real = preparer.store.save

    def save(cp: Any) -> None:
        time.sleep(delay)
        real(cp)
        log.append(set(cp.claims))

    preparer.store.save = save
    preparer.commits.save = save


def in_threads(fn: Any, refs: list[ClaimRef]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda r=r: out.update(fn([r]))) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_prepares_share_saves_and_answer_only_once_durable(tmp_path: Path) -> None:
    preparer, refs = node(tmp_path, 16)
    saves: list[set[str]] = []
    slow_saves(preparer, 0.05, saves)
    answered: dict[str, set[str]] = {}
    real_prepare = preparer.prepare

    def prepare(rs: list[ClaimRef]) -> Any:
        out = real_prepare(rs)
        answered[rs[0].uid] = set(saves[-1]) if saves else set()
        return out

    out = in_threads(prepare, refs)
    assert all(not p.error for p in out.values()), out
    # Fewer saves than claims: the ones queued behind the lock were saved together...
    assert len(saves) < len(refs) and preparer.commits.largest > 1
    # ...and each claim was answered after a save that held it.
    for uid, durable in answered.items():
        assert uid in durable
    on_disk = json.loads((tmp_path / "checkpoint.json").read_text())["payload"]["claims"]
    assert set(on_disk) == {r.uid for r in refs}
    errors = in_threads(preparer.unprepare, refs)
    assert all(e == "" for e in errors.values())
    on_disk = json.loads((tmp_path / "checkpoint.json").read_text())["payload"]["claims"]
    assert on_disk == {} and not list((tmp_path / "cdi").glob("*.json"))


def test_a_failed_group_save_fails_and_undoes_each_claim_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preparer, refs = node(tmp_path, 8)
    real = preparer.store.save
    full = threading.Event()

    def save(cp: Any) -> None:
        time.sleep(0.02)
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(cp)

    preparer.store.save = save
    preparer.commits.save = save
    preparer.prepare([refs[0]])  # one claim prepared before the disk fills
    full.set()
    out = in_threads(preparer.prepare, refs[1:])
    for r in refs[1:]:
        assert "checkpoint layer" in out[r.uid].error and "No space left" in out[r.uid].error
    full.clear()
    # Nothing of theirs is left: no CDI spec, no record; the first claim is intact.
    specs = sorted(p.name for p in (tmp_path / "cdi").glob("*.json"))
    assert specs == [f"gpu.dradriver.io-claim-{refs[0].uid}.json"]
    assert set(preparer.store.load().claims) == {refs[0].uid}
    # And they prepare fine once there is room.
    again = in_threads(preparer.prepare, refs[1:])
    assert all(not p.error for p in again.values())


def test_a_new_claim_takes_the_node_lock_once_and_a_prepared_one_needs_no_api_server(
    tmp_path: Path,
) -> None:
    """A claim this process has no record of goes straight to the API server, then to
    one locked step; one the other instance prepared meanwhile (a rolling update) still
    answers from the checkpoint when the API server cannot be reached."""
    claims = {}
    gpus = fake_names("3xH100-80GB", NODE)  # by NVML index
    for i in range(3):
        c = allocated_claim(f"c{i}", gpus[i])
        claims[c["metadata"]["uid"]] = c
    refs = [ClaimRef("team", uid, c["metadata"]["name"]) for uid, c in claims.items()]
    first, nvml = fake_preparer(tmp_path, "3xH100-80GB", lambda r: claims[r.uid], mode=MigMode.NONE)
    first.executor.mig = None
    assert first.prepare([refs[2]])[refs[2].uid].error == ""  # the checkpoint file exists

    def unreachable(ref: ClaimRef) -> dict[str, Any]:
        raise KubeError(0, "Unreachable", "connection refused")

    other, _ = fake_preparer(tmp_path, "3xH100-80GB", unreachable, mode=MigMode.NONE, nvml=nvml)
    other.executor.mig = None
    runs = []
    real_run = first.commits.run

    def counting_run(step: Any) -> Any:
        runs.append(step)
        return real_run(step)

    first.commits.run = counting_run  # type: ignore[method-assign]
    done = first.prepare([refs[0]])[refs[0].uid]
    assert done.error == "" and len(runs) == 1  # one locked step, under one node lock
    # `other` loaded the checkpoint before that prepare: its view has no record of it.
    assert other.store.cached is not None and refs[0].uid not in other.store.cached.claims
    again = other.prepare([refs[0]])[refs[0].uid]
    assert again.error == "" and again.devices == done.devices
    failed = other.prepare([refs[1]])[refs[1].uid]
    assert "connection refused" in failed.error


def test_no_caller_is_left_waiting_when_a_leader_cannot_take_the_lock() -> None:
    """Leaders hand over to the next queued caller, also when taking the node lock
    fails: every step runs once or its caller gets the error, and no thread hangs."""

    class FlakyLock:
        def __init__(self) -> None:
            self.n = 0
            self.held = threading.Lock()

        def __enter__(self) -> None:
            self.n += 1
            if self.n % 3 == 0:
                raise OSError(errno.EIO, "lock file unreadable")
            self.held.acquire()
            time.sleep(0.002)  # the others queue meanwhile

        def __exit__(self, *exc: object) -> None:
            self.held.release()

    saved: list[int] = []
    commits = GroupCommit(FlakyLock(), Checkpoint, lambda cp: saved.append(1))  # type: ignore[arg-type]
    ran: list[int] = []
    outcome: dict[int, str] = {}

    def call(i: int) -> None:
        def step(cp: Checkpoint) -> tuple[int, None]:
            ran.append(i)
            return i, None

        try:
            outcome[i] = f"ok {commits.run(step)}"
        except OSError:
            outcome[i] = "lock failed"

    threads = [threading.Thread(target=call, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert len(outcome) == 60
    done = {i for i, o in outcome.items() if o.startswith("ok")}
    assert sorted(ran) == sorted(done) and len(set(ran)) == len(ran)  # each step once
    assert all(outcome[i] == f"ok {i}" for i in done)
    assert "lock failed" in outcome.values() and done
