"""How deep a decoded JSON value nests, found without recursion (pure).

Opaque parameters are whatever a user wrote: nested thousands deep, they would make any
recursive walk (validation, comparison, an error message's repr) raise RecursionError.
Every decoder of user input checks depth first and refuses with the field path instead.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

# Far above anything a config needs (it is at most 5 levels deep).
MAX_DEPTH = 64
# A config sits about 8 levels down in a ResourceClaim (spec.devices.config[].opaque.
# parameters): a whole object may nest that much more.
OBJECT_DEPTH = MAX_DEPTH + 16


def too_deep(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested deeper than `limit` ("a.b[0].c"), or None."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > limit:
            return path or "(top level)"
        if isinstance(v, dict):
            for k, child in v.items():
                stack.append((child, f"{path}.{k}" if path else str(k), depth + 1))
        elif isinstance(v, list):
            for i, child in enumerate(v):
                stack.append((child, f"{path}[{i}]", depth + 1))
    return None


def nesting_message(path: str, limit: int = MAX_DEPTH) -> str:
    shown = path if len(path) <= 100 else path[:60] + "..." + path[-30:]
    return f"{shown}: nested more than {limit} levels deep; a config is a few levels at most"


# What the API server itself accepts (its JSON decoder stops at 10000 levels): a claim
# that deep is stored, so reading it must not fail with RecursionError.
MAX_PARSE_DEPTH = 10_001
# threading.stack_size is process-wide: one deep parse at a time sets and restores it.
_stack_lock = threading.Lock()


def loads(data: bytes | str) -> Any:
    """json.loads for values nested up to MAX_PARSE_DEPTH, which Python's own limit
    (about 1000) refuses: parsed in a thread of its own with room for that many levels.
    Deeper still raises RecursionError (callers report it as a bad value)."""
    try:
        return json.loads(data)
    except RecursionError:
        pass
    out: dict[str, Any] = {}

    def run() -> None:
        # The recursion limit is process-wide; only ever raised, never lowered here.
        if sys.getrecursionlimit() < 2 * MAX_PARSE_DEPTH + 1000:
            sys.setrecursionlimit(2 * MAX_PARSE_DEPTH + 1000)
        try:
            out["value"] = json.loads(data)
        except BaseException as exc:  # handed back to the caller's thread
            out["error"] = exc

    with _stack_lock:
        old = threading.stack_size(256 << 20)
        try:
            t = threading.Thread(target=run, name="deep-json")
            t.start()
        finally:
            threading.stack_size(old)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
