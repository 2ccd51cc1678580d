"""Prepares and unprepares that arrive together: each is saved under the node lock and
none is answered before the save that holds it; a failed save fails (and undoes) exactly
its own claim."""

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


def in_threads(fn: Any, refs: list[ClaimRef]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda r=r: out.update(fn([r]))) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_prepares_answer_only_once_durable(tmp_path: Path) -> None:
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
    # Each claim was answered after a save that held it.
    for uid, durable in answered.items():
        assert uid in durable
    on_disk = json.loads((tmp_path / "checkpoint.json").read_text())["payload"]["claims"]
    assert set(on_disk) == {r.uid for r in refs}
    errors = in_threads(preparer.unprepare, refs)
    assert all(e == "" for e in errors.values())
    on_disk = json.loads((tmp_path / "checkpoint.json").read_text())["payload"]["claims"]
    assert on_disk == {} and not list((tmp_path / "cdi").glob("*.json"))


def test_a_failed_save_fails_and_undoes_each_claim_it_held(
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
    held = []

    class Counting:
        def __init__(self, lock: Any) -> None:
            self.lock = lock

        def __enter__(self) -> None:
            held.append(1)
            self.lock.__enter__()

        def __exit__(self, *exc: object) -> None:
            self.lock.__exit__(*exc)

    first.lock = Counting(first.lock)
    done = first.prepare([refs[0]])[refs[0].uid]
    assert done.error == "" and len(held) == 1  # one locked step, under one node lock
    # `other` loaded the checkpoint before that prepare: its view has no record of it.
    assert other.store.cached is not None and refs[0].uid not in other.store.cached.claims
    again = other.prepare([refs[0]])[refs[0].uid]
    assert again.error == "" and again.devices == done.devices
    failed = other.prepare([refs[1]])[refs[1].uid]
    assert "connection refused" in failed.error
