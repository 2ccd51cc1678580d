"""Per-GPU locks: the hardware work of a prepare or unprepare (carving a MIG device,
switching MIG mode, setting a compute mode or time slice, starting an MPS daemon) holds
the locks of the GPUs it touches, not the node lock, so work on one GPU never waits for
work on another. The node lock is held only for the checkpoint updates around it.

One lock file per GPU under <state dir>/locks/, flock'ed, so the other plugin instance of
a rolling update is excluded as well as this one's threads. Locks are always taken in
sorted order, and never while the node lock is held (except without waiting: `try_hold`),
so no two holders can wait on each other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from dradriver.kubeletplugin.state.files import FileLock, LockTimeout
from dradriver.kubeletplugin.state.records import ClaimRecord


def record_gpus(rec: ClaimRecord) -> set[str]:
    """What a claim's hardware work touches: the GPU a partition is carved on, a whole
    GPU (MIG mode, compute mode, time slice), an existing MIG device (its daemon)."""
    gpus: set[str] = set()
    for d in rec.devices:
        if d.carve is not None:
            gpus.add(d.carve.gpu_uuid)
        elif d.uuid:
            gpus.add(d.uuid)
    return gpus


class GpuLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._locks: dict[str, FileLock] = {}
        self._made = threading.Lock()

    def _lock(self, gpu: str) -> FileLock:
        with self._made:
            lock = self._locks.get(gpu)
            if lock is None:
                # A UUID is "GPU-" or "MIG-" and hex: safe as a file name.
                lock = self._locks[gpu] = FileLock(self.directory / f"{gpu}.lock")
            return lock

    @contextlib.contextmanager
    def hold(self, gpus: Iterable[str]) -> Iterator[None]:
        """Waits for every GPU's lock, in sorted order."""
        with contextlib.ExitStack() as held:
            for gpu in sorted(set(gpus)):
                held.enter_context(self._lock(gpu))
            yield

    def try_hold(self, gpus: Iterable[str]) -> contextlib.ExitStack | None:
        """Every GPU's lock without waiting (the caller may hold the node lock), as a
        stack to close; None if any is held, by a thread of this instance or by the other
        instance: its hardware work on that GPU is in progress."""
        held = contextlib.ExitStack()
        try:
            for gpu in sorted(set(gpus)):
                lock = self._lock(gpu)
                lock.acquire(timeout=0)
                held.callback(lock.release)
        except LockTimeout:
            held.close()
            return None
        return held
