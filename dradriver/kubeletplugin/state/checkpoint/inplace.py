"""A file rewritten where it lies: the checkpoint's cheap write.

Replacing a file atomically costs a temp file, its fsync, a rename and the directory's
fsync: two journal commits. Overwriting blocks a file already owns and fdatasync'ing them
is none (the size does not change, so there is no metadata to commit). So the file keeps
its inode and never shrinks; content shorter than the file is padded with spaces, which
any JSON reader skips (an older release reading the checkpoint included). An in-place
write can be torn by a crash or a power loss: store.py keeps two such files as
write-ahead copies so that one holds the last complete state whatever happens.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dradriver.kubeletplugin.state.files import atomic_write

# Files grow in steps of this many bytes, so that a growing checkpoint rarely extends them.
BLOCK = 4096


class NotARegularFile(OSError):
    """Something other than a regular file (a directory, a device, a socket) lies at the
    path: it can neither be read as the file nor written over in place."""


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class InPlaceFile:
    """Not thread-safe: callers hold the node lock."""

    def __init__(self, path: Path, mode: int = 0o600, *, shared: bool = True) -> None:
        self.path = Path(path)
        self.mode = mode
        # Shared: another program may replace the file (an older release renames a new
        # one over it), so every access checks that the open file is still the one there.
        self.shared = shared
        self._fd: int | None = None
        self._size = 0

    def _current(self) -> int | None:
        """Our open file if it is still the one at `path`, else the one there now; None
        if there is none. `_size` is the file's size then: another writer (the other
        instance, of this release or another) may have grown it since."""
        if self._fd is not None:
            try:
                st = os.fstat(self._fd)
                if not self.shared or st.st_ino == os.stat(self.path).st_ino:
                    self._size = st.st_size
                    return self._fd
            except FileNotFoundError:
                pass
            self.close()
        # O_NONBLOCK: a FIFO put there must not hang the open (it is refused below).
        flags = os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(self.path, os.O_RDWR | flags)
        except FileNotFoundError:
            return None
        except IsADirectoryError as exc:
            raise NotARegularFile(exc.errno, f"{self.path} is a directory") from exc
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENXIO):
                raise
            fd = os.open(self.path, os.O_RDONLY | flags)  # readable still; writes fail
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotARegularFile(errno.EINVAL, f"{self.path} is not a regular file")
        os.set_blocking(fd, True)
        self._fd, self._size = fd, st.st_size
        return fd

    def write(self, data: bytes, *, sync: bool, checked: bool = False) -> bytes:
        """Makes the file hold `data` (padded) and returns the file's bytes. With `sync`,
        they are durable when this returns. A missing file is created atomically and
        durably. `checked`: present() answered True under the same hold of the node lock,
        so the open file is still the one there (nobody replaces it without that lock).
        Raises OSError; a failure while the file grows (disk full) leaves its old content
        readable, as only spaces were added past it."""
        # Padded to the size _current found, not to our own last one: content written
        # only that far would leave the end of another writer's longer state behind.
        fd = self._fd if checked and self._fd is not None else self._current()
        needed = -(-(len(data) + 1) // BLOCK) * BLOCK
        if fd is None:
            padded = data.ljust(needed)
            atomic_write(self.path, padded, mode=self.mode, durable=True)
            self._current()  # opened now, not on the hot path's first write
            return padded
        if needed > self._size:
            _write_all(fd, b" " * (needed - self._size), self._size)
            self._size = needed
        padded = data.ljust(self._size)
        _write_all(fd, padded, 0)
        if sync:
            os.fdatasync(fd)
        return padded

    def present(self) -> bool:
        return self._current() is not None

    def read(self) -> bytes | None:
        """The file's bytes; None if there is none. Raises OSError if it is unreadable.
        Through the kept-open file: a stat and a pread, no open."""
        fd = self._current()
        if fd is None:
            return None
        size = self._size  # as _current just found it
        data = os.pread(fd, size, 0)
        while len(data) < size:  # a short read
            more = os.pread(fd, size - len(data), len(data))
            if not more:
                break
            data += more
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
