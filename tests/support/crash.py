"""A process killed at a named crash point (dradriver.crashpoints), for crash tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from dradriver import crashpoints


class Crash(BaseException):
    """Stands for SIGKILL: nothing in the driver catches it, so no cleanup runs."""


@contextlib.contextmanager
def crash_at(point: str) -> Iterator[None]:
    """Inside the block, reaching crash point `point` raises Crash."""

    def crash(name: str) -> None:
        if name == point:
            raise Crash(name)

    crashpoints.hook = crash
    try:
        yield
    finally:
        crashpoints.hook = None
