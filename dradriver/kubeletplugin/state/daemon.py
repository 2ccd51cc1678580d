"""A daemon's record in the checkpoint: the pod that runs it (kubeletplugin/daemons/),
by name and UID, never by PID."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.kubeletplugin.state.decode import get, obj


@dataclass(frozen=True)
class DaemonRef:
    """A daemon pod: its name (stable for what it serves, so a retry or a later plugin
    finds it) and its UID ("" where only the name is known)."""

    name: str
    uid: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "uid": self.uid}

    @classmethod
    def from_json(cls, value: Any, where: str) -> DaemonRef:
        d = obj(value, where)
        return cls(get(d, "name", str, where=where), get(d, "uid", str, where=where))
