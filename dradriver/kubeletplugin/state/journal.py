"""Where the executor records a claim's progress: each step that changes the hardware is
durable in the checkpoint before the next one runs (prepare/execute.py).

- `InLock`: the caller holds the node lock and the checkpoint: a record is written into
  it and saved at once (or, not `durable`, left to the caller's group commit, for a
  claim that changes no hardware).
- `Committed`: the hardware work runs outside the node lock, under its GPUs' locks
  (gpu_locks.py), on a record of its own; each step publishes a copy of that record
  through the group commit, so it shares the save with whatever else is in flight and
  the checkpoint never holds an object another thread is changing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dradriver.errors import CheckpointError
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.group_commit import GroupCommit, OnSaveFailed
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
    def __init__(self, cp: Checkpoint, store: CheckpointStore, durable: bool = True) -> None:
        self.cp, self.store, self.durable = cp, store, durable

    def record(self, rec: ClaimRecord) -> None:
        self.cp.claims[rec.uid] = rec
        if self.durable:
            self.store.save(self.cp)

    def forget(self, rec: ClaimRecord) -> None:
        self.cp.claims.pop(rec.uid, None)
        if self.durable:
            self.store.save(self.cp)

    def held_whole(self, exclude: str) -> set[str]:
        return held_whole(self.cp, exclude)

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        return pod_totals(r for r in self.cp.claims.values() if r.uid != exclude)


class Committed:
    """`guard` runs under the node lock before a completed record is published: it raises
    to stop a prepare the kubelet has meanwhile unprepared from completing (the steps
    before are recorded unguarded, so a rollback can always record what it could not
    undo). `changed` sees the checkpoint after each change (the prepared-claims metric)."""

    def __init__(
        self,
        commits: GroupCommit,
        guard: Callable[[], None] = lambda: None,
        changed: Callable[[Checkpoint], None] = lambda cp: None,
    ) -> None:
        self.commits, self.guard, self.changed = commits, guard, changed

    def _publish(self, uid: str, rec: ClaimRecord | None) -> None:
        def step(cp: Checkpoint) -> tuple[None, OnSaveFailed]:
            before = cp.claims.get(uid)
            if rec is None:
                cp.claims.pop(uid, None)
            else:
                if rec.state == PREPARE_COMPLETED:
                    self.guard()
                cp.claims[uid] = rec
            self.changed(cp)

            def undo(cp: Checkpoint, exc: Exception) -> BaseException:
                if before is None:
                    cp.claims.pop(uid, None)
                else:
                    cp.claims[uid] = before
                self.changed(cp)
                return CheckpointError(f"checkpoint layer: {exc}", reason="checkpoint")

            return None, undo

        self.commits.run(step)

    def record(self, rec: ClaimRecord) -> None:
        self._publish(rec.uid, rec.copy())

    def forget(self, rec: ClaimRecord) -> None:
        self._publish(rec.uid, None)

    def held_whole(self, exclude: str) -> set[str]:
        return self.commits.run(lambda cp: (held_whole(cp, exclude), None))

    def pod_memory(self, exclude: str) -> dict[tuple[str, str], int]:
        return self.commits.run(
            lambda cp: (pod_totals(r for r in cp.claims.values() if r.uid != exclude), None)
        )
