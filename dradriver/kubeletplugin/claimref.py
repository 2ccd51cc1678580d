"""A claim as the kubelet names it, in a module of its own: the gRPC edge needs it before
anything heavy is imported (the registration socket comes first at startup)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it: the only three strings a prepare call carries."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
