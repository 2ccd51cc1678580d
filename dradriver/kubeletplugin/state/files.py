"""The plugin's file primitives, in one place for every file it owns (checkpoint, CDI
specs, the ledger): durable atomic replacement, cleanup of what a crash mid-write left,
a damaged file moved aside, and the lock two plugin instances (a rolling update) share:
the node lock (plugin.lock), the ledger's, each GPU's; and the one converter between the
state's typed records and JSON (at its end)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import math
import os
import socket
import threading
import time
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from dradriver.logs import get_logger

log = get_logger("kubeletplugin.files")

# A temp file lives for milliseconds; one this old was left by a crash mid-write.
STALE_TEMP_SECONDS = 600.0


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
    tmp = os.path.join(parent, f".{name}.{os.getpid()}-{threading.get_ident()}.tmp")
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
    locked. Reusable (enter it as often as needed) and safe to share between threads
    (they take turns on its thread lock, then on the flock: so one object is the node
    lock for this instance's threads and the other instance alike), but not reentrant:
    entering it again in the thread that holds it deadlocks (or times out).
    """

    def __init__(self, path: Path, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        # flock excludes other open files, hence other processes and other FileLock
        # objects; this excludes threads sharing this object (and its one open file).
        self._thread_lock = threading.Lock()
        self._file: int | None = None  # kept open: reopening cost more than the flock
        self.locked = False
        self._note = f"pid {os.getpid()} on {socket.gethostname()}".ljust(80)[:80].encode()

    def acquire(self, timeout: float | None = None) -> None:
        """Blocks until held; with a timeout (seconds; else the constructor's) raises
        LockTimeout once it has passed."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise LockTimeout(
                f"timed out after {timeout}s waiting for the lock {self.path} "
                "(held in this process: by another thread, or by this one, as it is not reentrant)"
            )
        try:
            self._lock_file(deadline, timeout)
            self.locked = True
        except BaseException:
            self._thread_lock.release()
            raise

    def _lock_file(self, deadline: float, timeout: float | None) -> None:
        # Without a timeout the kernel waits; with one, polled (backing off to 50 ms).
        how = fcntl.LOCK_EX if timeout is None else fcntl.LOCK_EX | fcntl.LOCK_NB
        delay = 0.001
        while True:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fd = self._file
            try:
                fcntl.flock(fd, how)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LockTimeout(
                        f"timed out after {timeout}s waiting for the lock "
                        f"{self.path}, held by {self._holder()}"
                    ) from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.05)
                continue
            # Held, unless someone removed or replaced the lock file meanwhile: a lock on
            # the old inode excludes nobody who opens the new one.
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            self._file = None
        # Who holds it, for the next waiter's timeout message (fixed width: no truncate).
        with contextlib.suppress(OSError):
            os.pwrite(fd, self._note + b"\n", 0)

    def _holder(self) -> str:
        with contextlib.suppress(OSError):
            return self.path.read_text().strip() or "an unknown process"
        return "an unknown process"

    def release(self) -> None:
        if not self.locked or self._file is None:
            raise RuntimeError(f"lock {self.path} released but not held")
        self.locked = False
        try:
            # The holder note stays, harmlessly stale.
            fcntl.flock(self._file, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the one converter between records and JSON ----------------------------------------------
# Driven by each dataclass's fields and type hints: a field's key is its name in camelCase
# (or its metadata's "key"), a field left at its default is not written (but where its
# metadata says "always"), pairs of strings are a JSON object, and a union of records is
# told apart by each one's TAG ("strategy"). Reading checks every type and names the path
# of what it found wrong; keys a record does not know are kept in its `unknown` field where
# it has one, else skipped.


class CheckpointCorrupt(ValueError):
    """The bytes are not state this release can trust."""


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, Any, bool], ...]:
    """(name, key, default or MISSING, written even at its default) of each field of the
    record class but `unknown`, worked out once per class: a save writes every claim's
    record, and working it out field by field was most of the CPU a save spent."""
    out = []
    for f in dataclasses.fields(cls):
        head, *rest = f.name.split("_")
        key = f.metadata.get("key", head + "".join(w.title() for w in rest))
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        out.append((f.name, key, default, bool(f.metadata.get("always"))))
    return tuple(x for x in out if x[0] != "unknown")


_SCALARS = (str, int, float, type(None))  # bool is an int


def to_json(value: Any) -> Any:
    """`value` as JSON: records as objects, tuples, lists and sets as arrays, pairs as
    objects."""
    if isinstance(value, _SCALARS):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = dict(getattr(value, "unknown", None) or {})
        if (tag := getattr(value, "TAG", None)) is not None:
            out["strategy"] = tag
        for name, key, default, always in _fields(type(value)):
            v = getattr(value, name)
            if always or v != default:
                out[key] = v if isinstance(v, _SCALARS) else to_json(v)
        return out
    if isinstance(value, tuple) and value and all(_is_pair(p) for p in value):
        return {k: v for k, v in value}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def _is_pair(p: Any) -> bool:
    return isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p)


_hints = functools.cache(get_type_hints)


def from_json(tp: Any, value: Any, where: str) -> Any:
    """`value` read as type `tp`; raises CheckpointCorrupt naming `where` and the path."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _union(args, value, where)
    if dataclasses.is_dataclass(tp):
        return _record(tp, value, where)
    if origin is tuple and args[0] == tuple[str, str]:
        pairs = _typed(value, dict, where)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
            raise CheckpointCorrupt(f"{where}: expected strings")
        return tuple(sorted(pairs.items()))
    if origin in (list, set, tuple):
        items = _typed(value, list, where)
        return origin(from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(items))
    if origin is dict:
        return {
            k: from_json(args[1], v, f"{where}.{k}") for k, v in _typed(value, dict, where).items()
        }
    if tp is float:
        return float(_typed(value, (int, float), where))
    return _typed(value, tp, where)


def _typed(value: Any, tp: type | tuple[type, ...], where: str) -> Any:
    types_ = tp if isinstance(tp, tuple) else (tp,)
    # bool is an int in Python but never a valid number here.
    if not isinstance(value, types_) or (isinstance(value, bool) and bool not in types_):
        names = " or ".join(t.__name__ for t in types_)
        raise CheckpointCorrupt(f"{where}: expected {names}, got {value!r:.60}")
    return value


def _union(args: tuple[Any, ...], value: Any, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return from_json(options[0], value, where)
    tag = _typed(value, dict, where).get("strategy")
    for option in options:
        if getattr(option, "TAG", None) == tag:
            return from_json(option, value, where)
    raise CheckpointCorrupt(f"{where}.strategy: unknown {tag!r}")


def _record(cls: Any, value: Any, where: str) -> Any:
    obj = _typed(value, dict, where)
    hints, known, kwargs = _hints(cls), {"strategy", "unknown"}, {}
    for name, k, default, _ in _fields(cls):
        known.add(k)
        if k not in obj and default is dataclasses.MISSING:
            raise CheckpointCorrupt(f"{where}: missing {k!r}")
        if obj.get(k) is None and default is not dataclasses.MISSING:
            continue  # absent or null: the default
        kwargs[name] = from_json(hints[name], obj[k], f"{where}.{k}")
    if "unknown" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["unknown"] = {k: v for k, v in obj.items() if k not in known}
    return cls(**kwargs)
