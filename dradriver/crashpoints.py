"""Crash points for the fault-injection tests: places where the node component can be
killed to prove that a restart recovers. Inert unless DRADRIVER_CRASHPOINT names the
point (the process then SIGKILLs itself there) or a test installs a hook."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

hook: Callable[[str], None] | None = None


def crashpoint(name: str) -> None:
    if hook is not None:
        hook(name)
    if os.environ.get("DRADRIVER_CRASHPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
