"""Loading and saving the checkpoint file, which must never take the plugin down (a newer
format is read as far as it is understood, a damaged file is moved aside, kept for a
human, and the plugin carries on with an empty state; a save is an atomic replace:
docs/design.md, "The checkpoint on disk"), and the journal the executor records each
step through. Callers hold the node lock, but for peek().
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from dradriver.kubeletplugin.state.checkpoint.codec import encode_checkpoint, parse_checkpoint
from dradriver.kubeletplugin.state.files import (
    CheckpointCorrupt,
    atomic_write,
    move_aside,
    remove_stale_temps,
)
from dradriver.kubeletplugin.state.pod_limits import pod_totals
from dradriver.kubeletplugin.state.records import (
    CURRENT_VERSION,
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    owned_partitions,
)
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.checkpoint")

CORRUPT = (
    "CHECKPOINT CORRUPT: starting with an empty state; what the claims recorded in it hold "
    "(MIG devices, sharing setups, CDI specs) is kept, and undone when the kubelet "
    "unprepares them (the ledger knows it)"
)


class NotARegularFile(OSError):
    """Something other than a regular file (a directory, a device, a socket) lies at the
    path: it can be neither read as the checkpoint nor replaced by one."""


def read_file(path: Path) -> bytes | None:
    """The file's bytes; None if there is none. O_NONBLOCK: a FIFO put there must not
    hang the open (it is refused as not a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotARegularFile(errno.EINVAL, f"{path} is not a regular file")
    with open(fd, "rb") as f:  # closes `fd`
        return f.read()


class CheckpointStore:
    """Load and save the checkpoint file. Call both under the node's FileLock."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id
        # The last checkpoint read or written, with the file's bytes then: a load that
        # finds the same bytes returns it without parsing. Every change to it is followed
        # by a save, and a failed save forgets it.
        self._cached: tuple[bytes, Checkpoint] | None = None
        # peek()'s own last complete view: never an object the lock holders change.
        self._peeked: Checkpoint | None = None

    @property
    def cached(self) -> Checkpoint | None:
        """The checkpoint as this process last read or wrote it, without I/O (None when
        it has none it trusts); it may be behind the file (the other instance): a hint,
        never an answer."""
        return None if (cached := self._cached) is None else cached[1]

    def remove_stale_temps(self) -> None:
        """At startup: temp files a crash mid-write left."""
        for tmp in remove_stale_temps(self.path):
            log.warning("removed a temp file left by an interrupted write", path=str(tmp))

    def _empty(self) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id, running_boot_id=self.boot_id)

    def load(self) -> Checkpoint:
        """The checkpoint on disk; empty if there is none or it cannot be trusted. Never
        raises for the file's content: a crash here would crash-loop the plugin."""
        try:
            data = read_file(self.path)
        except NotARegularFile as exc:
            return self._quarantine(
                str(exc),
                "CHECKPOINT PATH IS NOT A REGULAR FILE: moved aside; starting empty (the "
                "ledger still knows what must be undone for the claims it held)",
            )
        except OSError as exc:
            return self._quarantine(f"unreadable: {exc}")
        if self._cached is not None and self._cached[0] == data:
            return self._cached[1]
        self._cached = None
        if data is None:
            return self._empty()
        try:
            cp, notes = parse_checkpoint(data)
        except CheckpointCorrupt as exc:
            return self._quarantine(str(exc))
        for note in notes:
            log.warning("checkpoint: " + note, path=str(self.path), version=cp.version)
        cp.running_boot_id = self.boot_id
        if not notes:  # a newer release's is parsed again until it is saved in this format
            self._cached = (data, cp)
        return cp

    def _quarantine(self, reason: str, what: str = CORRUPT) -> Checkpoint:
        """checkpoint.json cannot be trusted: an empty state, the file moved aside for a
        human."""
        self._cached = None
        log.error(what, path=str(self.path), reason=reason, moved_to=move_aside(self.path))
        return self._empty()

    def peek(self) -> Checkpoint:
        """The checkpoint as the file holds it now, for a thread that does not hold the
        node lock: read afresh, never repaired, moved aside or logged; a file that cannot
        be read answers the last view read (empty before there was one). The result is
        this call's own object: the caller may read it at leisure."""
        with contextlib.suppress(OSError, CheckpointCorrupt):  # load() deals with it, locked
            data = read_file(self.path)
            if data is not None:
                self._peeked = parse_checkpoint(data)[0]
        return self._peeked or Checkpoint(boot_id=self.boot_id)

    def save(self, cp: Checkpoint) -> None:
        """Writes `cp` in the current format, durably. The stored boot ID becomes this
        boot's (the file describes what this boot's plugin knows), also in `cp`; so
        reconcile a new boot before the first save. Raises OSError (disk full, read-only
        state dir) with what the last save wrote still the state a load returns."""
        if self.boot_id:
            cp.boot_id = self.boot_id
        try:
            data = encode_checkpoint(cp)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, data, sync_dir=False)
        except BaseException:
            self._cached = None  # the caller changed it in memory; the file did not
            raise
        cp.version = CURRENT_VERSION
        cp.running_boot_id = self.boot_id
        self._cached = (data, cp)


def checkpoint_owned(store: CheckpointStore) -> Callable[[], set[tuple[str, int, int]]]:
    """The partitions the checkpoint's claims hold, as the publish thread reads them:
    through the store's lock-free peek(), never load(), which belongs to the holders of
    the node lock (it repairs and moves aside damaged files, and shares the store's cache)."""
    return lambda: owned_partitions(store.peek())


# -- the journal: where the executor records a claim's progress, each step that changes
# the hardware durable in the checkpoint before the next one runs (prepare/execute.py).
# Committed: the hardware work runs outside the node lock, under its GPUs' locks, and each
# step takes the node lock, loads the checkpoint, puts the record in and saves; InLock:
# the caller holds the node lock and the checkpoint.


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


class Committed:
    """`load` is the checkpoint under the node lock (it raises when this release may not
    touch it). `guard` runs under the node lock before a completed record is saved: it
    raises to stop a prepare the kubelet has meanwhile unprepared from completing (the
    steps before are recorded unguarded, so a rollback can always record what it could
    not undo). `changed` sees the checkpoint after each save (the prepared-claims
    metric)."""

    def __init__(
        self,
        lock: AbstractContextManager[object],
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
            return pod_totals(r for r in self.load().claims.values() if r.uid != exclude)


class InLock(Committed):
    """The journal of a caller that holds the node lock and `cp`: nothing more to take."""

    def __init__(self, cp: Checkpoint, store: CheckpointStore) -> None:
        super().__init__(contextlib.nullcontext(), load=lambda: cp, store=store)
