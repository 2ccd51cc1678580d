"""Group commit: checkpoint updates that arrive together share one durable save.

Each prepare or unprepare hands its checkpoint step to `GroupCommit.run`. The thread that
gets the node lock runs every step waiting (its own and those queued behind the lock
while the previous batch was saving), saves the checkpoint once, and answers them all.
A step is answered only after the save that holds its change: nothing is reported
prepared (or unprepared) before it is durable, as with one save per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dradriver.kubeletplugin.files import NodeLock
from dradriver.kubeletplugin.records import Checkpoint

T = TypeVar("T")

# What a step leaves to the batch's save: None (nothing changed, or the step saved
# itself), or how to undo its change in memory if that save fails, returning the error
# its caller gets.
OnSaveFailed = Callable[[Checkpoint, Exception], BaseException]
Step = Callable[[Checkpoint], tuple[T, OnSaveFailed | None]]


@dataclass
class _Job(Generic[T]):
    step: Step[T]
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None


class GroupCommit:
    def __init__(
        self,
        lock: NodeLock,
        load: Callable[[], Checkpoint],
        save: Callable[[Checkpoint], None],
    ) -> None:
        self.lock, self.load, self.save = lock, load, save
        self._queue: list[_Job[object]] = []
        self._queue_lock = threading.Lock()
        self.batches = 0  # for tests and metrics: saves made for batches
        self.largest = 0

    def run(self, step: Step[T]) -> T:
        job: _Job[T] = _Job(step)
        with self._queue_lock:
            self._queue.append(job)  # type: ignore[arg-type]
        with self.lock:
            if not job.done.is_set():
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._run_batch(batch)
        job.done.wait()  # set by this thread's batch, or an earlier holder's
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def _run_batch(self, batch: list[_Job[object]]) -> None:
        try:
            self._steps_then_save(batch)
        finally:
            for job in batch:  # never leave a caller waiting, whatever went wrong
                job.done.set()

    def _steps_then_save(self, batch: list[_Job[object]]) -> None:
        try:
            cp = self.load()
        except BaseException as exc:  # a refusal (newer checkpoint): every job gets it
            for job in batch:
                job.error = exc
            return
        pending: list[tuple[_Job[object], OnSaveFailed]] = []
        for job in batch:
            try:
                job.result, undo = job.step(cp)
                if undo is not None:
                    pending.append((job, undo))
            except BaseException as exc:
                job.error = exc
        if not pending:
            return
        self.batches += 1
        self.largest = max(self.largest, len(pending))
        try:
            self.save(cp)
        except Exception as exc:
            for job, undo in pending:
                job.result, job.error = None, undo(cp, exc)
