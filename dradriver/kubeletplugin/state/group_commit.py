"""Group commit: checkpoint updates that arrive together share one durable save.

Each prepare or unprepare hands its checkpoint step to `GroupCommit.run`. One thread
leads: it takes the node lock, runs every step waiting (its own and those queued while
the previous batch was saving), saves the checkpoint once, and answers them all.
A step is answered only after the save that holds its change: nothing is reported
prepared (or unprepared) before it is durable, as with one save per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from dradriver.kubeletplugin.state.files import NodeLock
from dradriver.kubeletplugin.state.records import Checkpoint

T = TypeVar("T")

# What a step leaves to the batch's save: None (nothing changed, or the step saved
# itself), or how to undo its change in memory if that save fails, returning the error
# its caller gets.
OnSaveFailed = Callable[[Checkpoint, Exception], BaseException]
Step = Callable[[Checkpoint], tuple[T, OnSaveFailed | None]]


@dataclass
class _Job(Generic[T]):
    step: Step[T]
    done: bool = False  # read and written under GroupCommit._changed
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
        # One thread of this process at a time leads: takes the node lock, runs the
        # queue, saves. The others wait here for their answer, not for the node lock: a
        # thread whose step another batch ran returns as soon as that batch is durable,
        # instead of queueing for the lock only to find its work done.
        self._changed = threading.Condition()
        self._leading = False
        self.batches = 0  # for tests and metrics: saves made for batches
        self.largest = 0

    def run(self, step: Step[T]) -> T:
        job: _Job[T] = _Job(step)
        with self._changed:
            self._queue.append(job)  # type: ignore[arg-type]
            while self._leading and not job.done:
                self._changed.wait()
            lead = not job.done
            if lead:
                self._leading = True
        if lead:
            try:
                with self.lock:
                    with self._changed:
                        batch, self._queue = self._queue, []
                    self._run_batch(batch)
            except BaseException:
                with self._changed:  # the lock was not had: no step of ours runs later
                    self._queue = [j for j in self._queue if j is not job]
                raise
            finally:
                with self._changed:
                    self._leading = False
                    self._changed.notify_all()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def _run_batch(self, batch: list[_Job[object]]) -> None:
        try:
            self._steps_then_save(batch)
        finally:
            with self._changed:  # never leave a caller waiting, whatever went wrong
                for job in batch:
                    job.done = True

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
