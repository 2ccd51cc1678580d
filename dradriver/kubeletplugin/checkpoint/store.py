"""Loading and saving the checkpoint file, which must never take the plugin down: peers
crash-looped on checkpoints written by another release and on corrupt ones. Here an older
format is migrated, a newer one is read as far as it is understood, and a damaged one is
moved aside (kept for a human) while the plugin carries on with an empty state.

Readers and writers on one node (two plugin instances during a rolling update) serialize
through files.FileLock; CheckpointStore itself does no locking.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dradriver.kubeletplugin.checkpoint.codec import encode_checkpoint, parse_checkpoint
from dradriver.kubeletplugin.files import atomic_write, fsync_dir, remove_stale_temps
from dradriver.kubeletplugin.records import CURRENT_VERSION, Checkpoint, CheckpointCorrupt
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.checkpoint")


class CheckpointStore:
    """Load and save the checkpoint file. Call both under the node's FileLock."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id
        # The last checkpoint read or written, with the file's bytes then: a load that
        # finds the same bytes returns it without parsing. Every change to it is followed
        # by a save, and a failed save forgets it.
        self._cached: tuple[bytes, Checkpoint] | None = None

    def remove_stale_temps(self) -> None:
        """At startup: temp files a crash mid-write left."""
        for tmp in remove_stale_temps(self.path):
            log.warning("removed a temp file left by an interrupted write", path=str(tmp))

    def _empty(self) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id, running_boot_id=self.boot_id)

    def load(self) -> Checkpoint:
        """The checkpoint on disk; empty if there is none or it cannot be trusted. Never
        raises for the file's content: a crash here would crash-loop the plugin."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._cached = None
            return self._empty()
        except OSError as exc:
            self._cached = None
            return self._quarantine(f"unreadable: {exc}")
        if self._cached is not None and self._cached[0] == data:
            return self._cached[1]
        self._cached = None
        try:
            cp, notes = parse_checkpoint(data)
        except CheckpointCorrupt as exc:
            return self._quarantine(str(exc))
        for note in notes:
            log.warning("checkpoint: " + note, path=str(self.path), version=cp.version)
        cp.running_boot_id = self.boot_id
        if not notes:  # a migrated one is parsed again until it is saved in this format
            self._cached = (data, cp)
        return cp

    def _quarantine(self, reason: str) -> Checkpoint:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.rename(self.path, target)
            fsync_dir(self.path.parent)
            moved = str(target)
        except OSError as exc:
            moved = f"(could not move it: {exc}; the next save overwrites it)"
        log.error(
            "CHECKPOINT CORRUPT: starting with an empty state; what the claims recorded in "
            "it hold (MIG devices, sharing setups, CDI specs) is kept, and undone when the "
            "kubelet unprepares them (the MIG and sharing ledgers know it)",
            path=str(self.path),
            reason=reason,
            moved_to=moved,
        )
        return self._empty()

    def save(self, cp: Checkpoint) -> None:
        """Writes `cp` atomically in the current format. The stored boot ID becomes this
        boot's (the file describes what this boot's plugin knows), also in `cp`; so
        reconcile a new boot before the first save. Raises OSError (disk full, read-only
        state dir) with the old file intact."""
        if self.boot_id:
            cp.boot_id = self.boot_id
        self._cached = None
        data = encode_checkpoint(cp)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, data, mode=0o600)
        cp.version = CURRENT_VERSION
        cp.running_boot_id = self.boot_id
        self._cached = (data, cp)
