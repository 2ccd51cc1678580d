"""User values quoted back in error messages, bounded. A message travels into the
webhook's answer, kubectl's output, the pod's events and every log line; a 100 KB key
must not travel with it, however the message quotes it. Pure."""

from __future__ import annotations

from typing import Any

# Enough to recognise any name or value of the config API (the longest, a MIG device's
# UUID, is 48 characters) and most typos of them.
ECHO_CHARS = 64
# A message names a handful of fields with what fits each; past this it is a dump.
MAX_MESSAGE = 1024


def cut(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def echo(value: Any) -> str:
    """A value as a message shows it: repr of a scalar, shortened past ECHO_CHARS; only
    the type of anything else (its repr could be any size)."""
    if isinstance(value, str):
        if len(value) <= ECHO_CHARS:
            return repr(value)
        return f"{value[:ECHO_CHARS]!r}... ({len(value)} characters)"
    if isinstance(value, bool | int | float) or value is None:
        return cut(repr(value))
    return type(value).__name__


def bounded(message: str) -> str:
    """The last guard for a message made of several echoed parts: at most MAX_MESSAGE
    characters whatever went into it."""
    if len(message) <= MAX_MESSAGE:
        return message
    tail = f"... ({len(message)} characters in all)"
    return message[: MAX_MESSAGE - len(tail)] + tail
