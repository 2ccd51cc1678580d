"""The plugin's file primitives, in one place for every file it owns (checkpoint, CDI
specs, the ledger): durable atomic replacement, cleanup of what a crash mid-write left,
a damaged file moved aside, the node-wide lock two plugin instances (a rolling update)
share, and the one locked read-modify-write of a file they both change."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dradriver.logs import get_logger

log = get_logger("kubeletplugin.files")

# A temp file lives for milliseconds; one this old was left by a crash mid-write.
STALE_TEMP_SECONDS = 600.0
T = TypeVar("T")


def fsync_dir(directory: Path) -> None:
    """Makes a rename in `directory` durable. The rename has happened either way, so a
    failure here is logged, not raised: the caller must not undo a visible write."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not fsync directory", path=str(directory), error=str(exc))


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    mode: int = 0o600,
    *,
    durable: bool = True,
    sync_dir: bool = True,
) -> None:
    """Replaces `path` with `data` so that a reader (or, when `durable`, the file after a
    crash or power loss) sees either the old content or the new, never a mix. The temp
    file is a dot file ending in .tmp in the same directory (a rename cannot cross
    filesystems, and CDI scanners only read *.json and *.yaml); it is removed if anything
    fails. Not `durable`: no fsync, for files rebuilt from a durable record after a
    crash (a power loss may leave them empty or gone). Not `sync_dir`: the rename is not
    synced, so a power loss right after may bring the old content back (never a mix)."""
    # Named for this thread: no two writers alive share the name, so no random name
    # (mkstemp's cost a third of a CDI spec's write); one a dead process left is reused.
    parent, name = os.path.split(os.fspath(path))
    parent = parent or "."
    tmp = f"{parent}/.{name}.{os.getpid()}-{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable and sync_dir:
        fsync_dir(Path(parent))


def remove_stale_temps(path: Path, older_than: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Deletes temp files of atomic_write(path) left behind by a crash."""
    removed = []
    cutoff = time.time() - older_than
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed.append(tmp)
    return removed


def move_aside(path: Path) -> str:
    """Renames a damaged file to a .corrupt-<time> name beside it, kept for a human;
    returns where it went, or why it could not."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    try:
        os.rename(path, target)
    except OSError as exc:
        return f"(could not move it: {exc}; the next write overwrites it)"
    fsync_dir(path.parent)
    return str(target)


class LockTimeout(TimeoutError):
    """Another holder kept the lock for longer than the timeout."""


class FileLock:
    """An exclusive flock(2) on `path`, shared by every plugin instance on the node.

    The kernel drops the lock when its holder dies, so a crash never leaves the node
    locked. Reusable (enter it as often as needed) and safe to share between threads,
    but not reentrant: entering it again in the thread that holds it deadlocks (or
    times out).
    """

    def __init__(self, path: Path, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        # flock excludes other open files, hence other processes and other FileLock
        # objects; this excludes threads sharing this object (and its one open file).
        self._thread_lock = threading.Lock()
        self._file: int | None = None  # kept open: reopening cost more than the flock
        self._held = False
        self._note = f"pid {os.getpid()} on {socket.gethostname()}".ljust(80)[:80].encode()

    @property
    def locked(self) -> bool:
        return self._held

    def acquire(self, timeout: float | None = None) -> None:
        """Blocks until held; with a timeout (seconds; else the constructor's) raises
        LockTimeout once it has passed."""
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise LockTimeout(
                f"timed out after {timeout}s waiting for the lock {self.path} "
                "(held in this process: by another thread, or by this one, as it is not reentrant)"
            )
        try:
            self._lock_file(deadline, timeout)
            self._held = True
        except BaseException:
            self._thread_lock.release()
            raise

    def _open(self) -> int:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._file

    def _replaced(self, fd: int) -> bool:
        """Someone removed or replaced the lock file: a lock on the old inode excludes
        nobody who opens the new one."""
        try:
            return os.fstat(fd).st_ino != os.stat(self.path).st_ino
        except FileNotFoundError:
            return True

    def _lock_file(self, deadline: float | None, timeout: float | None) -> None:
        while True:
            fd = self._open()
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                delay = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise LockTimeout(
                                f"timed out after {timeout}s waiting for the lock "
                                f"{self.path}, held by {self._holder()}"
                            ) from None
                        time.sleep(min(delay, remaining))
                        delay = min(delay * 2, 0.05)
            if not self._replaced(fd):
                break
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            self._file = None
        # Who holds it, for the next waiter's timeout message (fixed width: no truncate).
        with contextlib.suppress(OSError):
            os.pwrite(fd, self._note + b"\n", 0)

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "an unknown process"
        except OSError:
            return "an unknown process"

    def release(self) -> None:
        if not self._held or self._file is None:
            raise RuntimeError(f"lock {self.path} released but not held")
        self._held = False
        try:
            # The holder note stays, harmlessly stale.
            fcntl.flock(self._file, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        """Closes the kept-open file (which also drops a lock still held)."""
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class NodeLock:
    """The in-process mutex first (threads of this instance), then the FileLock (the
    other instance during a rolling update): what every checkpoint update holds."""

    def __init__(self, lock: FileLock) -> None:
        self.mutex = threading.Lock()
        self.lock = lock

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self.lock.__enter__()
        except BaseException:
            self.mutex.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.lock.__exit__(*exc)
        finally:
            self.mutex.release()


def locked_update(
    lock: FileLock,
    read: Callable[[], T],
    change: Callable[[T], bool],
    *,
    write: Callable[[T], None],
) -> T:
    """One change to a file several writers change at once (threads of this instance,
    the other instance during a rolling update): read, change (returns whether it
    changed anything), written (atomically, by `write`) only if it did, all under
    `lock`, so that no writer saves a stale read over another's change. The value after."""
    with lock:
        value = read()
        if change(value):
            write(value)
        return value
