"""Where the executor records a claim's progress: each step that changes the hardware is
durable in the checkpoint before the next one runs (prepare/execute.py).

- `InLock`: the caller holds the node lock and the checkpoint: a record is written into
  it and saved at once.
- `Committed`: the hardware work runs outside the node lock, under its GPUs' locks
  (gpu_locks.py); each step takes the node lock, loads the checkpoint, puts the record
  in (records are frozen: a step makes a new one) and saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.files import NodeLock
from dradriver.kubeletplugin.state.pod_limits import pod_totals
from dradriver.kubeletplugin.state.records import PREPARE_COMPLETED, Checkpoint, ClaimRecord


def held_whole(cp: Checkpoint, exclude: str = "") -> set[str]:
    """GPU UUIDs that claims (but `exclude`) hold whole."""
    return {
        d.uuid
        for r in cp.claims.values()
        if r.uid != exclude
        for d in r.devices
        if d.kind == "gpu" and d.uuid
    }


class Journal(Protocol):
    def record(self, rec: ClaimRecord) -> None:
        """`rec` as it is now, durably; raises OSError or a DriverError if not."""

    def forget(self, rec: ClaimRecord) -> None:
        """`rec` gone, durably; raises OSError or a DriverError if not."""

    def held_whole(self, exclude: str) -> set[str]:
        """GPUs that other claims than `exclude` hold whole."""

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        """(GPU, pod) -> the shares' memory other claims than `exclude` hold for the pod."""


class InLock:
    def __init__(self, cp: Checkpoint, store: CheckpointStore) -> None:
        self.cp, self.store = cp, store

    def record(self, rec: ClaimRecord) -> None:
        self.cp.claims[rec.uid] = rec
        self.store.save(self.cp)

    def forget(self, rec: ClaimRecord) -> None:
        self.cp.claims.pop(rec.uid, None)
        self.store.save(self.cp)

    def held_whole(self, exclude: str) -> set[str]:
        return held_whole(self.cp, exclude)

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        return pod_totals(r for r in self.cp.claims.values() if r.uid != exclude)


class Committed:
    """`load` is the checkpoint under the node lock (it raises when this release may not
    touch it). `guard` runs under the node lock before a completed record is saved: it
    raises to stop a prepare the kubelet has meanwhile unprepared from completing (the
    steps before are recorded unguarded, so a rollback can always record what it could
    not undo). `changed` sees the checkpoint after each save (the prepared-claims
    metric)."""

    def __init__(
        self,
        lock: NodeLock,
        *,
        load: Callable[[], Checkpoint],
        store: CheckpointStore,
        guard: Callable[[], None] = lambda: None,
        changed: Callable[[Checkpoint], None] = lambda cp: None,
    ) -> None:
        self.lock, self.load, self.store = lock, load, store
        self.guard, self.changed = guard, changed

    def _publish(self, uid: str, rec: ClaimRecord | None) -> None:
        with self.lock:
            cp = self.load()
            if rec is None:
                cp.claims.pop(uid, None)
            else:
                if rec.state == PREPARE_COMPLETED:
                    self.guard()
                cp.claims[uid] = rec
            self.store.save(cp)  # a failed save forgets `cp`: the next load reads the file
            self.changed(cp)

    def record(self, rec: ClaimRecord) -> None:
        self._publish(rec.uid, rec)

    def forget(self, rec: ClaimRecord) -> None:
        self._publish(rec.uid, None)

    def held_whole(self, exclude: str) -> set[str]:
        with self.lock:
            return held_whole(self.load(), exclude)

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        with self.lock:
            cp = self.load()
            return pod_totals(r for r in cp.claims.values() if r.uid != exclude)


class Latest:
    """A journal that remembers the record as it last stood (recorded, or returned by a
    step): what a rollback undoes from."""

    def __init__(self, journal: Journal, rec: ClaimRecord) -> None:
        self.journal, self.rec = journal, rec

    def seen(self, rec: ClaimRecord) -> None:
        self.rec = rec

    def record(self, rec: ClaimRecord) -> None:
        self.rec = rec
        self.journal.record(rec)

    def forget(self, rec: ClaimRecord) -> None:
        self.journal.forget(rec)

    def held_whole(self, exclude: str) -> set[str]:
        return self.journal.held_whole(exclude)

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        return self.journal.pod_memory(exclude)
