"""The checkpoint on disk: round trips, crash safety, corrupt and foreign files (never an
exception, never a crash loop), boot-ID reconciliation and the node-wide file lock."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dradriver.kubeletplugin.state import checkpoint as ckpt
from dradriver.kubeletplugin.state.checkpoint import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
    current_boot_id,
    parse_checkpoint,
    payload_checksum,
    reconcile_boot,
)
from dradriver.kubeletplugin.state.files import FileLock, LockTimeout
from dradriver.kubeletplugin.state.records import (
    Carve,
    DaemonRef,
    MigIds,
    Mps,
    MpsLimits,
    TimeSlicing,
)

REPO = Path(__file__).resolve().parents[5]
BOOT1 = "6f1d2c4e-0000-4000-8000-000000000001"
BOOT2 = "6f1d2c4e-0000-4000-8000-000000000002"
UID_A = "0f3c9a52-7b1d-4c8e-9a6f-2d4b8c1e5f70"
UID_B = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"


def device(name: str = "gpu-0", **kw: Any) -> PreparedDevice:
    args: dict[str, Any] = {
        "request_names": ["gpu"],
        "pool": "node-a",
        "device": name,
        "cdi_device_ids": [f"gpu.dradriver.io/claim={name}-{UID_A}"],
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
    }
    args.update(kw)
    return PreparedDevice(**args)


def record(uid: str = UID_A, state: str = PREPARE_COMPLETED, **kw: Any) -> ClaimRecord:
    args: dict[str, Any] = {
        "uid": uid,
        "namespace": "team-a",
        "name": f"claim-{uid[:4]}",
        "state": state,
        "devices": [device()],
        "updated_at": 1_700_000_000.25,
    }
    args.update(kw)
    return ClaimRecord(**args)


def checkpoint(*records: ClaimRecord, boot_id: str = BOOT1) -> Checkpoint:
    return Checkpoint(boot_id=boot_id, claims={r.uid: r for r in records})


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "checkpoint.json"


def envelope(payload: dict[str, Any], version: int = 1, **extra: Any) -> bytes:
    doc = {"version": version, "checksum": payload_checksum(payload), "payload": payload}
    doc.update(extra)
    return json.dumps(doc).encode()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# -- round trip and file format --------------------------------------------------------------


def test_round_trip_keeps_every_field(path: Path) -> None:
    carved = device(
        "gpu-0-mig-1g10gb-0",
        request_names=["small", "shared"],
        uuid="MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        kind="mig",
        minor=0,
        carve=Carve("GPU-1", 19, "1g.10gb", 0, 1, 1, 7, 0),
        sharing=Mps(
            MpsLimits(40, "10Gi", (("0", "5Gi"),)),
            applied=True,
            pipe_dir="/p",
            log_dir="/l",
            daemon=DaemonRef("mps-c-0", "6f1b2c3d-0000-4000-8000-000000000001"),
        ),
        unknown={"fromNewerRelease": {"a": 1}},
    )
    static = device("gpu-1-mig-1g10gb-3", kind="mig", minor=1, mig=MigIds(9, 0))
    sliced = device("gpu-2", minor=2, sharing=TimeSlicing("Long", applied=True))
    original = checkpoint(
        record(
            UID_A,
            devices=[device(uuid=None), carved, static, sliced],
            unknown={"pods": ["p1"]},
        ),
        record(UID_B, state=PREPARE_STARTED, devices=[]),
    )
    store = CheckpointStore(path, BOOT1)
    store.save(original)
    loaded = store.load()
    assert loaded == original
    assert loaded.claims[UID_A].devices[0].uuid is None
    assert loaded.claims[UID_A].devices[1].mig_ids() == (7, 0)
    assert loaded.claims[UID_A].devices[2].mig_ids() == (9, 0)
    assert loaded.claims[UID_B].state == PREPARE_STARTED
    assert loaded.running_boot_id == BOOT1
    # A field at its default is not written; a newer release's key is written back.
    doc = json.loads(path.read_text())["payload"]["claims"][UID_A]["devices"][1]
    assert set(doc) - {"requestNames", "pool", "device", "cdiDeviceIds", "uuid"} == {
        "kind", "minor", "carve", "sharing", "fromNewerRelease"
    }  # fmt: skip
    assert doc["carve"]["gpuInstanceId"] == 7 and doc["carve"]["gpuUUID"] == "GPU-1"
    assert doc["sharing"]["strategy"] == "MPS"


def test_file_is_versioned_checksummed_and_private(path: Path) -> None:
    CheckpointStore(path, BOOT1).save(checkpoint(record()))
    doc = json.loads(path.read_text())
    # The envelope every release reads, and this release's save counter beside it (not in
    # the payload: a release before it would warn about an unknown field on every load).
    assert set(doc) == {"version", "checksum", "minReader", "payload"}
    assert set(doc["payload"]) == {"bootId", "claims"}
    assert doc["version"] == CURRENT_VERSION == 1
    assert doc["checksum"] == payload_checksum(doc["payload"])
    assert doc["checksum"].startswith("sha256:")
    assert doc["payload"]["bootId"] == BOOT1
    claim = doc["payload"]["claims"][UID_A]
    assert claim["state"] == "PrepareCompleted"
    assert claim["devices"][0]["cdiDeviceIds"] == [f"gpu.dradriver.io/claim=gpu-0-{UID_A}"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert leftovers(path.parent) == []


def test_missing_file_is_an_empty_checkpoint(path: Path) -> None:
    cp = CheckpointStore(path, BOOT1).load()
    assert cp.claims == {}
    assert cp.boot_id == BOOT1
    assert cp.version == CURRENT_VERSION
    assert not path.exists()


def test_save_rejects_inconsistent_records_and_keeps_old_file(path: Path) -> None:
    store = CheckpointStore(path, BOOT1)
    store.save(checkpoint(record()))
    before = path.read_bytes()
    bad = Checkpoint(boot_id=BOOT1, claims={UID_B: record(UID_A)})
    with pytest.raises(ValueError, match="stored under"):
        store.save(bad)
    with pytest.raises(ValueError, match="unknown state"):
        store.save(checkpoint(record(state="Prepared")))
    with pytest.raises(TypeError):
        store.save(checkpoint(record(unknown={"x": object()})))
    assert path.read_bytes() == before
    assert leftovers(path.parent) == []


# -- atomicity -------------------------------------------------------------------------------


def saved(path: Path) -> CheckpointStore:
    """A store whose checkpoint holds UID_A."""
    store = CheckpointStore(path, BOOT1)
    store.save(checkpoint(record(UID_A)))
    return store


def test_a_save_is_a_durable_atomic_replace(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp file synced and renamed over the checkpoint, as the kubelet's own
    checkpoint store does: a crash leaves the old state or the new one."""
    store = saved(path)
    inode = path.stat().st_ino
    calls: list[str] = []
    for name in ("fsync", "fdatasync", "replace", "rename"):
        real = getattr(os, name)

        def spy(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(os, name, spy)
    cp = store.load()
    cp.claims[UID_B] = record(UID_B)
    store.save(cp)
    monkeypatch.undo()
    assert calls == ["fsync", "replace"]
    assert path.stat().st_ino != inode
    assert sorted(CheckpointStore(path, BOOT1).load().claims) == sorted([UID_A, UID_B])
    assert leftovers(path.parent) == []


@pytest.mark.parametrize("fails", ["fsync", "write"])
def test_a_failed_save_leaves_the_old_state(
    path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """A failing disk (EIO at the sync) or a full one (ENOSPC while writing): the error
    is raised, and the file, this store and a new start all hold the last saved state."""
    store = saved(path)
    before = path.read_bytes()
    code = errno.EIO if fails == "fsync" else errno.ENOSPC

    def fail(*a: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, fails, fail)
    big = checkpoint(*(record(f"{i:08d}-0000-4000-8000-000000000000") for i in range(40)))
    with pytest.raises(OSError) as info:
        store.save(big)
    monkeypatch.undo()
    assert info.value.errno == code
    assert path.read_bytes() == before
    assert list(store.load().claims) == [UID_A]
    assert list(CheckpointStore(path, BOOT1).load().claims) == [UID_A]
    assert leftovers(path.parent) == []
    store.save(big)  # once the disk is back, it saves
    assert len(CheckpointStore(path, BOOT1).load().claims) == 40


def _crash_in_save(path: Path, patch: str) -> subprocess.CompletedProcess[str]:
    """A real process that adds UID_B and dies (os._exit, no cleanup) where `patch`
    makes it."""
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from dradriver.kubeletplugin.state import checkpoint as c
        {patch}
        store = c.CheckpointStore(Path({str(path)!r}), {BOOT1!r})
        cp = store.load()
        cp.claims[{UID_B!r}] = c.ClaimRecord({UID_B!r}, "ns", "n", c.PREPARE_STARTED, [], 1.0)
        store.save(cp)
        os._exit(0)
    """)
    return subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "patch",
    [
        "os.fsync = lambda fd: os._exit(137)",
        "os.replace = lambda a, b: os._exit(137)",
        "real = os.write; os.write = lambda f, d: (real(f, bytes(d)[:50]), os._exit(137))",
    ],
    ids=["before the sync", "before the rename", "halfway through the write"],
)
def test_a_crash_in_a_save_leaves_the_state_before(path: Path, patch: str) -> None:
    saved(path)
    before = path.read_bytes()
    proc = _crash_in_save(path, patch)
    assert proc.returncode == 137, proc.stderr
    assert path.read_bytes() == before
    store = CheckpointStore(path, BOOT1)
    assert list(store.load().claims) == [UID_A]
    # The crash's temp file is removed at a later start, once it is surely nobody's.
    (tmp,) = [path.parent / name for name in leftovers(path.parent)]
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    store.remove_stale_temps()
    assert leftovers(path.parent) == []


# -- corrupt files ---------------------------------------------------------------------------


def _valid_payload() -> dict[str, Any]:
    return json.loads(ckpt.encode_checkpoint(checkpoint(record())))["payload"]  # type: ignore[no-any-return]


def _with_claim(**changes: Any) -> bytes:
    payload = _valid_payload()
    payload["claims"][UID_A].update(changes)
    return envelope(payload)


CORRUPT = {
    "not json": b"{this is not json",
    "torn write": ckpt.encode_checkpoint(checkpoint(record()))[:97],
    "empty file": b"",
    "binary": b"\xff\xfe\x00garbage",
    "top-level list": b"[1, 2, 3]",
    "version is a string": envelope(_valid_payload(), version="1"),  # type: ignore[arg-type]
    "negative version": envelope(_valid_payload(), version=-1),
    "no payload": json.dumps({"version": 1, "checksum": "sha256:00"}).encode(),
    "claims is a list": envelope({"bootId": BOOT1, "claims": []}),
    "state unknown to v1": _with_claim(state="Prepared"),
    "uid mismatch": _with_claim(uid=UID_B),
    "devices not a list": _with_claim(devices={"gpu-0": {}}),
    "updatedAt is a bool": _with_claim(updatedAt=True),
    "pool is a number": _with_claim(
        devices=[{"requestNames": ["gpu"], "pool": 7, "device": "gpu-0", "cdiDeviceIds": []}]
    ),
    "request names not strings": _with_claim(
        devices=[{"requestNames": [1], "pool": "p", "device": "gpu-0", "cdiDeviceIds": []}]
    ),
    "NaN": envelope(_valid_payload()).replace(b"1700000000.25", b"NaN"),
    "version 0": json.dumps({"version": 0, "claims": {}}).encode(),
    "no version": envelope(_valid_payload()).replace(b'"version": 1', b'"v": 1'),
}


@pytest.mark.parametrize("content", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_file_is_moved_aside_and_state_starts_empty(
    path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    store = CheckpointStore(path, BOOT1)
    with caplog.at_level(logging.ERROR):
        cp = store.load()
    assert cp.claims == {} and cp.boot_id == BOOT1
    assert not path.exists()
    aside = list(path.parent.glob("checkpoint.json.corrupt-*"))
    assert len(aside) == 1
    assert aside[0].read_bytes() == content  # kept for a human to look at
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "CHECKPOINT CORRUPT" in errors[0].getMessage()
    assert errors[0].fields["moved_to"] == str(aside[0])  # type: ignore[attr-defined]
    # The plugin carries on: it can save and read its new state.
    store.save(checkpoint(record(UID_B)))
    assert list(store.load().claims) == [UID_B]


def test_bad_checksum_is_detected(path: Path) -> None:
    CheckpointStore(path, BOOT1).save(checkpoint(record()))
    doc = json.loads(path.read_text())
    doc["payload"]["claims"][UID_A]["devices"][0]["device"] = "gpu-7"  # edited by hand
    data = json.dumps(doc).encode()
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        parse_checkpoint(data)
    path.write_bytes(data)
    assert CheckpointStore(path, BOOT1).load().claims == {}
    assert len(list(path.parent.glob("checkpoint.json.corrupt-*"))) == 1


def test_checksum_ignores_formatting(path: Path) -> None:
    # Re-indenting (an editor, `jq .`) is not corruption; changing a value is.
    CheckpointStore(path, BOOT1).save(checkpoint(record()))
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc, indent=7, sort_keys=False))
    assert list(CheckpointStore(path, BOOT1).load().claims) == [UID_A]


def test_two_corrupt_files_in_one_second_both_kept(path: Path) -> None:
    path.parent.mkdir(parents=True)
    store = CheckpointStore(path, BOOT1)
    for content in (b"first", b"second"):
        path.write_bytes(content)
        store.load()
    kept = sorted(p.read_bytes() for p in path.parent.glob("checkpoint.json.corrupt-*"))
    assert kept == [b"first", b"second"]


def test_unreadable_checkpoint_does_not_raise(path: Path) -> None:
    path.mkdir(parents=True)  # a directory where the file should be
    cp = CheckpointStore(path, BOOT1).load()
    assert cp.claims == {}
    assert len(list(path.parent.glob("checkpoint.json.corrupt-*"))) == 1


# -- other releases --------------------------------------------------------------------------


def _v2_payload() -> dict[str, Any]:
    payload = _valid_payload()
    payload["nodeName"] = "node-a"  # unknown top-level field
    payload["claims"][UID_A]["leases"] = [{"pod": "p1"}]  # unknown claim field
    payload["claims"][UID_A]["devices"][0]["health"] = "Healthy"  # unknown device field
    started = dict(payload["claims"][UID_A], uid=UID_B, state="UnprepareStarted")
    payload["claims"][UID_B] = started
    return payload


def test_newer_version_loads_what_it_understands(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(envelope(_v2_payload(), version=2, compression=None))
    store = CheckpointStore(path, BOOT1)
    with caplog.at_level(logging.WARNING):
        cp = store.load()
    assert cp.version == 2
    assert cp.claims[UID_A].state == PREPARE_COMPLETED
    assert cp.claims[UID_A].devices[0].device == "gpu-0"
    # A state this release does not know means "unfinished": undo or redo it.
    assert cp.claims[UID_B].state == PREPARE_STARTED
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "newer release" in messages and "UnprepareStarted" in messages
    assert f"claims.{UID_A}.leases" in messages and "nodeName" in messages
    assert not list(path.parent.glob("*.corrupt-*"))

    # Unknown fields survive our save, so an upgrade back finds them.
    store.save(cp)
    doc = json.loads(path.read_text())
    assert doc["version"] == CURRENT_VERSION
    assert doc["payload"]["nodeName"] == "node-a"
    assert doc["payload"]["claims"][UID_A]["leases"] == [{"pod": "p1"}]
    assert doc["payload"]["claims"][UID_A]["devices"][0]["health"] == "Healthy"
    assert store.load().claims[UID_A].unknown == {"leases": [{"pod": "p1"}]}


def test_newer_version_with_bad_checksum_is_corrupt(path: Path) -> None:
    payload = _v2_payload()
    data = envelope(payload, version=2).replace(b"node-a", b"node-b", 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    assert CheckpointStore(path, BOOT1).load().claims == {}
    assert len(list(path.parent.glob("checkpoint.json.corrupt-*"))) == 1


# -- boot ------------------------------------------------------------------------------------


def mixed(boot_id: str = BOOT1) -> Checkpoint:
    return checkpoint(record(UID_A), record(UID_B, state=PREPARE_STARTED), boot_id=boot_id)


def test_same_boot_reports_interrupted_prepares() -> None:
    cp = mixed()
    before = json.loads(ckpt.encode_checkpoint(cp))
    r = reconcile_boot(cp, BOOT1)
    assert r.rebooted is False
    assert [c.uid for c in r.interrupted] == [UID_B]
    assert r.dropped == [] and r.recheck == []
    # Interrupted claims stay recorded until the caller has rolled them back.
    assert set(r.checkpoint.claims) == {UID_A, UID_B}
    assert r.checkpoint.boot_id == BOOT1
    assert json.loads(ckpt.encode_checkpoint(cp)) == before  # pure


def test_reboot_drops_unfinished_and_rechecks_completed() -> None:
    cp = mixed()
    r = reconcile_boot(cp, BOOT2)
    assert r.rebooted is True
    assert [c.uid for c in r.dropped] == [UID_B]
    assert [c.uid for c in r.recheck] == [UID_A]
    assert r.interrupted == []
    assert list(r.checkpoint.claims) == [UID_A]
    assert r.checkpoint.boot_id == BOOT2
    # The input is untouched.
    assert cp.boot_id == BOOT1 and set(cp.claims) == {UID_A, UID_B}


def test_checkpoint_without_boot_id_counts_as_reboot() -> None:
    r = reconcile_boot(mixed(boot_id=""), BOOT2)
    assert r.rebooted is True
    assert [c.uid for c in r.recheck] == [UID_A]


def test_unknown_current_boot_assumes_the_worst_of_both() -> None:
    r = reconcile_boot(mixed(), "")
    assert r.rebooted is None
    assert [c.uid for c in r.interrupted] == [UID_B]
    assert [c.uid for c in r.recheck] == [UID_A]
    assert r.dropped == []
    assert r.checkpoint.boot_id == BOOT1
    assert set(r.checkpoint.claims) == {UID_A, UID_B}


def test_reboot_seen_through_the_store(path: Path) -> None:
    CheckpointStore(path, BOOT1).save(mixed())
    after_reboot = CheckpointStore(path, BOOT2)
    cp = after_reboot.load()
    r = reconcile_boot(cp)  # the running boot ID comes from the store
    assert r.rebooted is True
    assert [c.uid for c in r.dropped] == [UID_B]
    after_reboot.save(r.checkpoint)
    r2 = reconcile_boot(after_reboot.load())
    assert r2.rebooted is False and r2.interrupted == [] and r2.recheck == []


def test_save_records_the_running_boot(path: Path) -> None:
    # Whatever a process writes describes its own boot.
    cp = mixed(boot_id=BOOT1)
    CheckpointStore(path, BOOT2).save(cp)
    assert cp.boot_id == BOOT2
    assert json.loads(path.read_text())["payload"]["bootId"] == BOOT2
    # Without a readable boot ID the stored one is kept rather than blanked.
    CheckpointStore(path, "").save(cp)
    assert json.loads(path.read_text())["payload"]["bootId"] == BOOT2


def test_current_boot_id(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "boot_id"
    f.write_text(BOOT1 + "\n")
    assert current_boot_id(f) == BOOT1
    with caplog.at_level(logging.WARNING):
        assert current_boot_id(tmp_path / "missing") == ""
    assert any("boot ID" in r.getMessage() for r in caplog.records)
    if Path(ckpt.BOOT_ID_PATH).exists():
        real = current_boot_id()
        assert len(real) == 36 and real.count("-") == 4


# -- file lock -------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dradriver.kubeletplugin.state.files import FileLock
    with FileLock(Path(sys.argv[1])):
        print("locked", flush=True)
        sys.stdin.readline()
""")


def hold_in_subprocess(lock_path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    lock_path = tmp_path / "plugin.lock"
    proc = hold_in_subprocess(lock_path)
    try:
        start = time.monotonic()
        with pytest.raises(LockTimeout, match=f"held by pid {proc.pid}"):
            FileLock(lock_path, timeout=0.3).acquire()
        assert time.monotonic() - start >= 0.3
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    with FileLock(lock_path, timeout=5) as lock:
        assert lock.locked
    assert not lock.locked


def test_lock_is_freed_when_its_holder_dies(tmp_path: Path) -> None:
    lock_path = tmp_path / "plugin.lock"
    proc = hold_in_subprocess(lock_path)
    proc.send_signal(signal.SIGKILL)
    assert f"pid {proc.pid} " in lock_path.read_text()
    proc.wait(timeout=30)
    # Taken at once (LockTimeout after 5 s had the kernel kept the dead holder's lock),
    # and the note beside it now names this process.
    with FileLock(lock_path, timeout=5) as lock:
        assert lock.locked
        assert f"pid {os.getpid()} " in lock_path.read_text()


def test_lock_excludes_a_second_fd_in_this_process(tmp_path: Path) -> None:
    lock_path = tmp_path / "plugin.lock"
    first, second = FileLock(lock_path), FileLock(lock_path)
    with first, pytest.raises(LockTimeout):
        second.acquire(timeout=0.1)
    with second:
        assert second.locked


def test_lock_serializes_threads_sharing_one_object(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "plugin.lock")
    inside = 0
    overlaps: list[int] = []

    def work() -> None:
        nonlocal inside
        for _ in range(50):
            with lock:
                inside += 1
                overlaps.append(inside)
                time.sleep(0.0005)
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(overlaps) == 200 and max(overlaps) == 1


def test_blocking_acquire_waits_for_release(tmp_path: Path) -> None:
    lock_path = tmp_path / "plugin.lock"
    holder = FileLock(lock_path)
    holder.acquire()
    timer = threading.Timer(0.2, holder.release)
    timer.start()
    start = time.monotonic()
    with FileLock(lock_path):  # no timeout: waits
        waited = time.monotonic() - start
    timer.join()
    assert waited >= 0.15


def test_lock_misuse(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "sub" / "plugin.lock")
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()
    # The directory is created; reentry times out with a reason instead of hanging.
    with lock, pytest.raises(LockTimeout, match="not reentrant"):
        lock.acquire(timeout=0.05)


# -- the cached load --------------------------------------------------------------------------


def test_a_load_of_unchanged_bytes_is_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", BOOT1)
    cp = store.load()
    cp.claims[UID_A] = record()
    store.save(cp)
    parsed: list[bytes] = []
    real = ckpt.store.parse_checkpoint
    monkeypatch.setattr(ckpt.store, "parse_checkpoint", lambda d: parsed.append(d) or real(d))
    assert store.load() is cp and store.load() is cp and parsed == []
    # Another instance (a rolling update) writes: the next load reads its bytes.
    other = CheckpointStore(tmp_path / "checkpoint.json", BOOT1)
    theirs = other.load()
    theirs.claims[UID_B] = record(UID_B)
    other.save(theirs)
    assert len(parsed) == 1  # the other instance's first load
    assert sorted(store.load().claims) == sorted([UID_A, UID_B]) and len(parsed) == 2


def test_a_failed_save_forgets_the_cached_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change whose save failed must not be served by the next load as if it were on
    disk."""
    store = CheckpointStore(tmp_path / "checkpoint.json", BOOT1)
    cp = store.load()
    cp.claims[UID_A] = record()
    store.save(cp)

    def full(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    cp.claims[UID_B] = record(UID_B)
    with pytest.raises(OSError):
        store.save(cp)
    again = store.load()
    assert again is not cp and list(again.claims) == [UID_A]
