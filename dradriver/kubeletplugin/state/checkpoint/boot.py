"""What a (re)start must do about the claims in the checkpoint: the same boot (a crash
interrupted prepares), a new boot (MIG and /var/run/cdi are gone), or an unknown one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dradriver.kubeletplugin.state.records import PREPARE_COMPLETED, Checkpoint, ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.checkpoint")

BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"


def current_boot_id(path: str | Path = BOOT_ID_PATH) -> str:
    """This boot's random ID, or "" (with a warning) if it cannot be read; "" makes
    reconcile_boot assume the worst of both cases."""
    try:
        boot_id = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning(
            "cannot read the boot ID; reboots will not be detected", path=str(path), error=str(exc)
        )
        return ""
    if not boot_id:
        log.warning("the boot ID is empty; reboots will not be detected", path=str(path))
    return boot_id


@dataclass
class BootReconciliation:
    checkpoint: Checkpoint  # to save: dropped claims removed, boot ID updated
    rebooted: bool | None  # None: no current boot ID, so nobody can tell
    # Rebooted mid-prepare: removed from the checkpoint; the caller cleans up anything
    # that outlived the reboot (files in /etc, MIG devices on drivers that keep them).
    dropped: list[ClaimRecord] = field(default_factory=list)
    # Rebooted, prepared: still valid, but their CDI specs in /var/run/cdi are gone and
    # must be rewritten (and their devices checked) before the kubelet asks again.
    recheck: list[ClaimRecord] = field(default_factory=list)
    # Same boot, mid-prepare: a crash interrupted them; the caller rolls them back and
    # then removes them. Still in the checkpoint.
    interrupted: list[ClaimRecord] = field(default_factory=list)


def reconcile_boot(cp: Checkpoint, boot_id: str | None = None) -> BootReconciliation:
    """What a (re)start must do about the claims in `cp`, given the running boot ID
    (`boot_id`, else the one CheckpointStore.load recorded). Does not modify `cp`."""
    current = boot_id if boot_id is not None else (cp.running_boot_id or "")
    started = [r for r in cp.claims.values() if r.state != PREPARE_COMPLETED]
    completed = [r for r in cp.claims.values() if r.state == PREPARE_COMPLETED]
    if not current:
        # Unknown: undo unfinished prepares (safe whether or not we rebooted) and rewrite
        # the specs of finished ones (idempotent), keeping the stored boot ID.
        out = dataclasses.replace(cp, claims=dict(cp.claims))
        return BootReconciliation(out, None, recheck=completed, interrupted=started)
    if cp.boot_id == current:
        out = dataclasses.replace(cp, claims=dict(cp.claims), running_boot_id=current)
        return BootReconciliation(out, False, interrupted=started)
    kept = {uid: r for uid, r in cp.claims.items() if r.state == PREPARE_COMPLETED}
    out = dataclasses.replace(cp, boot_id=current, claims=kept, running_boot_id=current)
    return BootReconciliation(out, True, dropped=started, recheck=completed)
