"""Loading and saving the checkpoint file, which must never take the plugin down: peers
crash-looped on checkpoints written by another release and on corrupt ones. Here an older
format is migrated, a newer one is read as far as it is understood, and a damaged one is
moved aside (kept for a human) while the plugin carries on with an empty state.

A save costs one fdatasync of blocks the files already own (inplace.py), not the temp
file, rename and two fsyncs of an atomic replace. It writes the new state first to one of
two write-ahead copies (`checkpoint.json.wal0`/`.wal1`, alternating: a write torn by a
crash or a power loss spoils only the older copy), durably, then into checkpoint.json
itself without a sync: checkpoint.json always reads as the newest state while the node
runs, so an older release beside this one during a rolling update, or after a rollback,
reads it as it always has. After a crash or a power loss checkpoint.json may be torn or
behind: the first load compares the payloads' save counters ("seq") and takes the newest
complete state, preferring checkpoint.json on a tie (an older release rewrites it
keeping the counter it found).

Readers and writers on one node (two plugin instances during a rolling update) serialize
through files.FileLock; CheckpointStore itself does no locking. The one exception is
peek(), for threads that do not hold the node lock (the publish loop): it reads the file
through a descriptor of its own, never repairs or moves anything, and answers the last
complete state it saw when a save is rewriting the file under it.

Something other than a regular file at the checkpoint's path (a directory made by a
mistaken volume mount) is moved aside and reported like a damaged file, and the state
taken from the write-ahead copies: it never crash-loops the plugin.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from dradriver.kubeletplugin.state.checkpoint.codec import encode_checkpoint, parse_checkpoint
from dradriver.kubeletplugin.state.checkpoint.inplace import InPlaceFile, NotARegularFile
from dradriver.kubeletplugin.state.files import fsync_dir, remove_stale_temps
from dradriver.kubeletplugin.state.records import (
    CURRENT_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    owned_partitions,
)
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.checkpoint")


def wal_paths(path: Path) -> tuple[Path, Path]:
    """The two write-ahead copies of the checkpoint at `path`."""
    return path.with_name(path.name + ".wal0"), path.with_name(path.name + ".wal1")


class CheckpointStore:
    """Load and save the checkpoint file. Call both under the node's FileLock."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id
        self._main = InPlaceFile(self.path)
        # Only this release writes its copies, and always in place.
        self._wals = tuple(InPlaceFile(p, shared=False) for p in wal_paths(self.path))
        # The highest save counter seen: the next save writes the one after it.
        self._seq = 0
        # The write-ahead copies are read by the first load (what a crash or power loss
        # left) and when checkpoint.json cannot be read; later loads see our own writes
        # or another instance's complete ones.
        self._started = False
        # checkpoint.json as last seen was written by another release (no save counter):
        # the next save syncs it too, so that no copy of ours can look newer than it
        # after a power loss unless it is.
        self._foreign = True
        # The last checkpoint read or written, with the file's bytes then: a load that
        # finds the same bytes returns it without parsing. Every change to it is followed
        # by a save, and a failed save forgets it.
        self._cached: tuple[bytes, Checkpoint] | None = None
        # peek()'s own last complete view: never an object the lock holders change.
        self._peeked: Checkpoint | None = None

    @property
    def cached(self) -> Checkpoint | None:
        """The checkpoint as this process last read or wrote it, without I/O (None when
        it has none it trusts); it may be behind the file (the other instance) and ahead
        of what is durable (a step waiting for its save): a hint, never an answer."""
        cached = self._cached
        return None if cached is None else cached[1]

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
            data = self._main.read()
        except NotARegularFile as exc:
            # Neither readable nor writable in place: out of the way first, so that the
            # repair from a copy (or the next save) makes a regular file there again.
            moved = self._move_aside()
            log.error(
                "CHECKPOINT PATH IS NOT A REGULAR FILE: moved aside; taking the state from "
                "the write-ahead copies, else starting empty (the ledgers still know what "
                "the claims it held were given)",
                path=str(self.path),
                reason=str(exc),
                moved_to=moved,
            )
            return self._recover(str(exc), moved=True)
        except OSError as exc:
            return self._recover(f"unreadable: {exc}")
        if data is None:
            # None, or moved aside by a human to start afresh: the copies are not
            # brought back, but later saves must outnumber them.
            self._cached = None
            self._first_look(b"")
            return self._empty()
        if self._cached is not None and self._cached[0] == data:
            return self._cached[1]
        self._cached = None
        try:
            cp, notes = parse_checkpoint(data)
        except CheckpointCorrupt as exc:
            return self._recover(str(exc))
        copies = self._first_look(data)
        self._foreign = cp.seq is None
        if cp.seq is not None and cp.version <= CURRENT_VERSION:
            # Our own save, so a copy with a higher counter is a later save whose write
            # of this file a crash or power loss cut short.
            newer = [c for c in copies if (c[1].seq or 0) > cp.seq]
            if newer:
                return self._take_copy(max(newer, key=lambda c: c[1].seq or 0), "behind")
        return self._accept(data, cp, notes)

    def _first_look(self, main: bytes) -> list[tuple[bytes, Checkpoint, list[str]]]:
        """The first load's look at the copies (none later): their counters, so that
        the next saves outnumber them, and those that differ from `main`."""
        if self._started:
            return []
        self._started = True
        copies = self._copies(main)
        self._seq = max([self._seq, *(c[1].seq or 0 for c in copies)])
        return copies

    def _accept(self, data: bytes, cp: Checkpoint, notes: list[str]) -> Checkpoint:
        for note in notes:
            log.warning("checkpoint: " + note, path=str(self.path), version=cp.version)
        cp.running_boot_id = self.boot_id
        self._seq = max(self._seq, cp.seq or 0)
        if not notes:  # a migrated one is parsed again until it is saved in this format
            self._cached = (data, cp)
        return cp

    def _copies(self, main: bytes) -> list[tuple[bytes, Checkpoint, list[str]]]:
        """The write-ahead copies that hold a complete checkpoint other than `main`."""
        out = []
        for wal in self._wals:
            try:
                data = wal.read()
            except OSError:
                continue
            if not data or data.rstrip() == main.rstrip():
                continue
            try:
                cp, notes = parse_checkpoint(data)
            except CheckpointCorrupt:
                continue  # the torn one: the other holds the state before it
            out.append((data, cp, notes))
        return out

    def _take_copy(self, copy: tuple[bytes, Checkpoint, list[str]], why: str) -> Checkpoint:
        data, cp, notes = copy
        log.warning(
            f"checkpoint: {self.path.name} was {why}; took the newest complete state from "
            "its write-ahead copy (a crash or power loss interrupted a save)",
            path=str(self.path),
            seq=cp.seq,
        )
        try:
            data = self._main.write(data.rstrip(), sync=True)
            self._foreign = False
        except OSError as exc:
            log.error("could not repair the checkpoint file", path=str(self.path), error=str(exc))
        return self._accept(data, cp, notes)

    def _recover(self, reason: str, moved: bool = False) -> Checkpoint:
        """checkpoint.json cannot be trusted: the newest write-ahead copy if one is
        complete, else an empty state, the file kept aside for a human (`moved`: it
        already is)."""
        self._cached = None
        self._started = True
        copies = self._copies(b"")
        self._seq = max([self._seq, *(c[1].seq or 0 for c in copies)])
        if copies:
            newest = max(copies, key=lambda c: c[1].seq or 0)
            return self._take_copy(newest, f"damaged ({reason})")
        if moved:
            return self._empty()
        return self._quarantine(reason)

    def _move_aside(self) -> str:
        """Renames what lies at the path to a .corrupt-<time> name beside it; returns
        where it went, or why it could not."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.rename(self.path, target)
            fsync_dir(self.path.parent)
            self._main.close()
            return str(target)
        except OSError as exc:
            return f"(could not move it: {exc}; the next save overwrites it)"

    def _quarantine(self, reason: str) -> Checkpoint:
        moved = self._move_aside()
        log.error(
            "CHECKPOINT CORRUPT: starting with an empty state; what the claims recorded in "
            "it hold (MIG devices, sharing setups, CDI specs) is kept, and undone when the "
            "kubelet unprepares them (the MIG and sharing ledgers know it)",
            path=str(self.path),
            reason=reason,
            moved_to=moved,
        )
        return self._empty()

    def peek(self) -> Checkpoint:
        """The checkpoint as the file holds it now, for a thread that does not hold the
        node lock. Read afresh through a descriptor of its own (the store's open file,
        cache and counters belong to the lock holders); never repairs, moves aside or
        logs. A read that overlaps an in-place save sees a torn file: it is read again,
        and then the last complete view is answered (empty before there was one). The
        result is this call's own object: the caller may read it at leisure."""
        for delay in (0.0, 0.001, 0.01):
            time.sleep(delay)
            try:
                data = self._read_fresh()
            except OSError:
                break  # missing, unreadable or not a file: load() deals with that
            if data is None:
                break
            try:
                cp, _ = parse_checkpoint(data)
            except CheckpointCorrupt:
                continue  # torn by a save in progress, or damaged: load() decides which
            self._peeked = cp
            return cp
        last = self._peeked
        return last if last is not None else Checkpoint(boot_id=self.boot_id)

    def _read_fresh(self) -> bytes | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def save(self, cp: Checkpoint) -> None:
        """Writes `cp` in the current format, durably. The stored boot ID becomes this
        boot's (the file describes what this boot's plugin knows), also in `cp`; so
        reconcile a new boot before the first save. Raises OSError (disk full, read-only
        state dir) with what the last save wrote still the state a load returns."""
        if self.boot_id:
            cp.boot_id = self.boot_id
        # The cached view stays while the save runs: the lock-free hint (`cached`) is
        # read then most of all, while this save's fsync has the node lock; only a load,
        # which cannot run meanwhile, would trust it as the file's content.
        seq = self._seq + 1
        previous, cp.seq = cp.seq, seq
        try:
            data = encode_checkpoint(cp)
            if not self._main.present():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # The first save (or the file was moved aside): created durably, so a
                # load never prefers older copies over a state that was saved.
                data = self._main.write(data, sync=True)
                self._wals[seq % 2].write(data, sync=True)
            else:
                self._write_ahead(self._wals[seq % 2], data)  # durable from here on
                data = self._main.write(data, sync=self._foreign, checked=True)
        except BaseException:
            cp.seq = previous
            self._cached = None  # the file may hold neither this state nor the cached one
            raise
        self._seq = seq
        self._started = True
        self._foreign = False
        cp.version = CURRENT_VERSION
        cp.running_boot_id = self.boot_id
        self._cached = (data, cp)

    def _write_ahead(self, wal: InPlaceFile, data: bytes) -> None:
        try:
            wal.write(data, sync=True)
        except BaseException:
            # A state whose save failed must not be read back by the next start as the
            # newest: the copy is made a copy of checkpoint.json again, if it can be.
            try:
                current = self._main.read()
                if current is not None:
                    wal.write(current.rstrip(), sync=False)
            except OSError as exc:
                log.warning(
                    "could not restore a write-ahead copy", path=str(wal.path), error=str(exc)
                )
            raise


def checkpoint_owned(store: CheckpointStore) -> Callable[[], set[tuple[str, int, int]]]:
    """The partitions the checkpoint's claims hold, as the publish thread reads them:
    through the store's lock-free peek(), never load(), which belongs to the holders of
    the node lock (it repairs and moves aside damaged files, and shares the store's open
    file and cache); a load overlapping an in-place save would take a torn file for a
    damaged one, from the wrong thread."""
    return lambda: owned_partitions(store.peek())
