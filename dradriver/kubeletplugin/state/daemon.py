"""A daemon's record in the checkpoint: the pod that runs it (kubeletplugin/daemons/),
by name and UID, never by PID."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DaemonRef:
    """A daemon pod: its name (stable for what it serves, so a retry or a later plugin
    finds it) and its UID ("" where only the name is known)."""

    name: str
    uid: str = field(default="", metadata={"always": True})
