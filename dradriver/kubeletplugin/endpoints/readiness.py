"""What /readyz checks beside the API server (api_probe.py): the kubelet accepted the
registration, the API server holds the node's slices, the checkpoint is one this release
may touch. Each check answers (ready, why) from what the plugin's parts report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dradriver.logs import get_logger

if TYPE_CHECKING:
    from dradriver.slices.publish_loop import PublishLoop
    from dradriver.slices.watch import SliceWatch

log = get_logger("kubeletplugin")

# The kubelet scans its plugin registry within seconds; after this long without being
# accepted, the likeliest cause is a socket in a directory the kubelet does not watch.
REGISTRATION_PATIENCE = 45.0


def not_registered_message(kubelet_dir: Path, waited: float) -> str:
    return (
        f"not registered with the kubelet after {waited:.0f} s: it probably does not watch "
        f"{kubelet_dir / 'plugins_registry'}, where the registration socket is; set "
        "--kubelet-dir (Helm kubeletDir) to the kubelet's --root-dir (default /var/lib/kubelet)"
    )


@dataclass
class Registration:
    """Whether the kubelet has accepted us, and if not, why: its refusal, or how long we
    have waited."""

    kubelet_dir: Path
    registered: bool = False
    refused: str = ""  # the kubelet's reason, when it refused us
    since: float = field(default_factory=time.monotonic)  # waiting since
    warned: bool = False

    def check(self) -> tuple[bool, str]:
        if self.registered:
            return True, "registered"
        if self.refused:
            return False, f"the kubelet refused the registration: {self.refused}"
        waited = time.monotonic() - self.since
        if waited > REGISTRATION_PATIENCE:
            return False, not_registered_message(self.kubelet_dir, waited)
        return False, "waiting for the kubelet"

    def changed(self, ok: bool, error: str) -> None:
        """The kubelet's answer (registration.py's hook)."""
        self.registered, self.refused = ok, ("" if ok else error)
        if not ok and not error:  # the socket was recreated: waiting again
            self.since = time.monotonic()

    def warn_once_waiting(self) -> None:
        """A warning in the log, once per wait, when the wait is past its patience."""
        waited = time.monotonic() - self.since
        if self.registered or waited <= REGISTRATION_PATIENCE:
            self.warned = False
        elif not self.warned:
            log.warning(not_registered_message(self.kubelet_dir, waited))
            self.warned = True


def slices_check(loop: PublishLoop, watch: SliceWatch) -> Callable[[], tuple[bool, str]]:
    """What the API server holds, not what was last written."""

    def check() -> tuple[bool, str]:
        if not loop.published.is_set():
            return False, loop.last_error or "not published yet"
        wanted = loop.last_stats.devices if loop.last_stats else 0
        if watch.synced.is_set() and wanted and not watch.devices_held():
            return False, "the API server holds none of this node's slices; republishing"
        return True, loop.last_error or "published"

    return check


@dataclass
class CheckpointCheck:
    """Why prepares are refused (a checkpoint from a newer release); `refusal` is None
    until the checkpoint is loaded (the endpoints start before that)."""

    refusal: Callable[[], str] | None = None

    def __call__(self) -> tuple[bool, str]:
        if self.refusal is None:
            return False, "not loaded yet"
        why = self.refusal()
        return not why, why or "ok"
