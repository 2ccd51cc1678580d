"""The daemons prepared claims depend on (MPS control daemons, IMEX daemons), each run as a
pod of its own so that it outlives the plugin's container: spec.py says what the pod is,
pods.py makes and stops it through the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dradriver.kubeletplugin.daemons.spec import DaemonRef, DaemonSpec, Role


class Daemons(Protocol):
    """Where daemons run: pods.DaemonPods on a node; unit tests run them as processes."""

    def start(self, spec: DaemonSpec) -> DaemonRef:
        """Starts the daemon, or finds the one of its name already there."""

    def wait(self, ref: DaemonRef, ready: Callable[[], bool], *, timeout: float) -> None:
        """Until it runs and `ready()`; DaemonError saying why not."""

    def serving(self, ref: DaemonRef) -> bool:
        """It is there (with `ref`'s UID, where known) and runs."""

    def stop(self, ref: DaemonRef, *, timeout: float = 60.0) -> None:
        """Stops it and waits until it is gone (idempotent)."""

    def find(self, role: Role, **serves: str) -> list[tuple[DaemonRef, dict[str, str]]]:
        """This node's daemons of `role` serving what `serves` names, with their labels."""
