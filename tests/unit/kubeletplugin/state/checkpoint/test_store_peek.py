"""The publish thread reads the checkpoint without the node lock (issue Q10, item 6):
through CheckpointStore.peek(), which reads afresh, never repairs or moves a file aside,
and answers the last complete state when an older release beside it rewrites the file in place."""

from __future__ import annotations

import threading
from pathlib import Path

from dradriver.kubeletplugin.state.checkpoint import (
    PREPARE_COMPLETED,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
)
from dradriver.kubeletplugin.state.checkpoint.store import checkpoint_owned
from dradriver.kubeletplugin.state.records import Carve


def record(i: int) -> ClaimRecord:
    # Records of growing size: saves rewrite, and grow, the file in place.
    return ClaimRecord(
        uid=f"u{i}",
        namespace="team",
        name=f"c{i}" + "x" * (i * 37 % 500),
        state=PREPARE_COMPLETED,
        devices=[
            PreparedDevice(
                ["r"],
                "node-a",
                f"gpu-{i % 4}-mig-1g10gb-{i % 7}",
                [],
                kind="mig",
                carve=Carve(f"GPU-{i % 4}", 19, "1g.10gb", i % 7, 1, 1, 1, 0),
            )
        ],
    )


def test_refreshes_during_saves_never_repair_move_aside_or_fail(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, "boot-1")
    cp = store.load()
    store.save(cp)
    owned = checkpoint_owned(store)
    seen: list[set[tuple[str, int, int]]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def publish() -> None:
        try:
            while not stop.is_set():
                seen.append(owned())
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=publish)
    reader.start()
    try:
        for i in range(300):  # the lock holder's saves
            cp.claims[f"u{i}"] = record(i)
            if i % 3 == 2:
                cp.claims.pop(f"u{i - 1}")
            store.save(cp)
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert len(seen) > 10
    # Only complete states were answered: each a set of partitions some save held.
    every = {(f"GPU-{i % 4}", 19, i % 7) for i in range(300)}
    assert all(s <= every for s in seen)
    assert not list(tmp_path.glob("*.corrupt-*"))  # nothing taken for damaged
    assert store.load().claims == cp.claims  # the lock holder's own view is intact
    assert owned() == {(d.carve.gpu_uuid, 19, d.carve.placement_start)
                       for r in cp.claims.values() for d in r.devices if d.carve}  # fmt: skip


def test_peek_answers_the_last_complete_view_of_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, "boot-1")
    cp = store.load()
    cp.claims["u1"] = record(1)
    store.save(cp)
    assert set(store.peek().claims) == {"u1"}
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # an older release's in-place save, half-way
    assert set(store.peek().claims) == {"u1"}
    assert not list(tmp_path.glob("*.corrupt-*")) and path.read_bytes() == data[: len(data) // 2]
    # A peek that changed nothing: load (under the lock) decides (a file still torn, no
    # copy of that release beside it: damaged, moved aside).
    assert store.load().claims == {} and len(list(tmp_path.glob("*.corrupt-*"))) == 1


def test_peek_before_any_file_is_empty(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", "boot-1")
    assert store.peek().claims == {}
    assert not (tmp_path / "checkpoint.json").exists()
