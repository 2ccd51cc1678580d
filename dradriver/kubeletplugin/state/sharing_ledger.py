"""What this driver changed on a GPU for sharing, kept apart from the checkpoint.

A claim's record says what its prepare did, but a record can be lost (a corrupt
checkpoint moved aside) or rewritten (a restart re-applying a setup), and a lost "mode
before" leaves a GPU in EXCLUSIVE_PROCESS for good. So every sharing change is written
here first, per GPU, and only ever removed once undone (the MPS daemons themselves are
pods, kubeletplugin/daemons/: the API is their record, found by their claim's label):

- computeMode: GPU -> the compute mode it had before this driver first changed it, and
  the claim it was changed for. Written once: setting the mode again for the same claim
  (a daemon restarted after a reboot) never overwrites what the GPU had before;
- timeSlice: GPU -> the claim whose interval is set (undone by setting Default);
- shareDaemons: device UUID -> the pipe directory of the one MPS daemon the device's
  shares (consumable capacity) run under, the compute mode the GPU had before it, and
  its members (share ID -> claim): a member is added before its namespace is made and
  removed after it is gone, so the last one out stops the daemon, also for a claim the
  checkpoint lost.

Startup undoes every entry whose claim the checkpoint no longer holds. Loading never
raises: an unreadable ledger is moved aside and reported, like the checkpoint. Each
change is a read and a write under the ledger's own lock: prepares on different GPUs
change it at the same time, and a write from a stale read would drop the other's entry.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.kubeletplugin.state.files import FileLock, atomic_write
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.sharing")

VERSION = 1


@dataclass(frozen=True)
class ModeChange:
    before: int  # NVML_COMPUTEMODE_*
    claim: str


@dataclass(frozen=True)
class SharedDaemon:
    pipe_dir: str
    gpu: str  # the GPU whose compute mode it changed; "" for a MIG device
    mode_before: int | None  # that GPU's mode before; None when unchanged
    members: dict[str, str] = field(default_factory=dict)  # share ID -> claim


@dataclass
class Entries:
    compute_mode: dict[str, ModeChange] = field(default_factory=dict)
    time_slice: dict[str, str] = field(default_factory=dict)  # GPU -> claim
    shared: dict[str, SharedDaemon] = field(default_factory=dict)  # device UUID -> daemon

    def claims(self) -> set[str]:
        return (
            {m.claim for m in self.compute_mode.values()}
            | set(self.time_slice.values())
            | {c for d in self.shared.values() for c in d.members.values()}
        )


class SharingLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(path.with_name(path.name + ".lock"))

    def _update(self, change: Callable[[Entries], bool]) -> Entries:
        """Load, change (returns whether it changed anything), save: one at a time."""
        with self._lock:
            e = self.load()
            if change(e):
                self.save(e)
            return e

    def load(self) -> Entries:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Entries()
        except (OSError, ValueError, RecursionError) as exc:
            return self._aside(f"unreadable: {exc}")
        try:
            return _decode(doc)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            return self._aside(f"unexpected content: {exc}")

    def _aside(self, reason: str) -> Entries:
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        with contextlib.suppress(OSError):
            os.rename(self.path, target)
        log.error(
            "sharing ledger unreadable: GPUs whose compute mode this driver changed may need "
            "`nvidia-smi -c DEFAULT` by hand",
            path=str(self.path),
            reason=reason,
            moved_to=str(target),
        )
        return Entries()

    def save(self, e: Entries) -> None:
        doc: dict[str, Any] = {
            "version": VERSION,
            "computeMode": {
                g: {"before": m.before, "claim": m.claim} for g, m in sorted(e.compute_mode.items())
            },
            "timeSlice": {g: {"claim": c} for g, c in sorted(e.time_slice.items())},
            "shareDaemons": {
                k: {
                    "pipeDir": d.pipe_dir,
                    "gpu": d.gpu,
                    "modeBefore": d.mode_before,
                    "members": dict(sorted(d.members.items())),
                }
                for k, d in sorted(e.shared.items())
            },
        }
        atomic_write(self.path, json.dumps(doc).encode(), 0o600)

    # -- the changes ---------------------------------------------------------------------
    def mode_changing(self, gpu: str, before: int, claim: str) -> int:
        """Records, before the change, the mode `gpu` had; returns the recorded one (an
        earlier record wins: it is what the GPU had before this driver touched it)."""

        def change(e: Entries) -> bool:
            if gpu in e.compute_mode:
                return False
            e.compute_mode[gpu] = ModeChange(before, claim)
            return True

        return self._update(change).compute_mode[gpu].before

    def mode_restored(self, gpu: str) -> None:
        self._update(lambda e: e.compute_mode.pop(gpu, None) is not None)

    def slice_changing(self, gpu: str, claim: str) -> None:
        def change(e: Entries) -> bool:
            if e.time_slice.get(gpu) == claim:
                return False
            e.time_slice[gpu] = claim
            return True

        self._update(change)

    def slice_restored(self, gpu: str) -> None:
        self._update(lambda e: e.time_slice.pop(gpu, None) is not None)

    def shared_daemon(
        self, device: str, pipe_dir: str, *, gpu: str, mode_before: int | None
    ) -> SharedDaemon:
        """Records the device's shared daemon before it starts, keeping its members and
        the first mode recorded for its GPU."""

        def change(e: Entries) -> bool:
            old = e.shared.get(device)
            before = old.mode_before if old is not None and old.gpu == gpu else mode_before
            members = dict(old.members) if old is not None else {}
            e.shared[device] = SharedDaemon(pipe_dir, gpu, before, members)
            return True

        return self._update(change).shared[device]

    def member(self, device: str, share: str, claim: str | None) -> SharedDaemon | None:
        """Adds (claim) or removes (None) a share of the device's daemon; what is left."""

        def change(e: Entries) -> bool:
            d = e.shared.get(device)
            if d is None:
                return False
            members = dict(d.members)
            if claim is None:
                if members.pop(share, None) is None:
                    return False
            elif members.get(share) == claim:
                return False
            else:
                members[share] = claim
            e.shared[device] = SharedDaemon(d.pipe_dir, d.gpu, d.mode_before, members)
            return True

        return self._update(change).shared.get(device)

    def shared_stopped(self, device: str) -> None:
        self._update(lambda e: e.shared.pop(device, None) is not None)


def _decode(doc: Any) -> Entries:
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"version {version!r}")
    # A newer release's ledger is read for the fields this one knows: entries are only
    # ever undone, so reading fewer never changes a GPU the newer release still uses.
    e = Entries()
    for g, m in dict(doc.get("computeMode") or {}).items():
        e.compute_mode[str(g)] = ModeChange(int(m["before"]), str(m["claim"]))
    for g, t in dict(doc.get("timeSlice") or {}).items():
        e.time_slice[str(g)] = str(t["claim"])
    for k, d in dict(doc.get("shareDaemons") or {}).items():
        before = d.get("modeBefore")
        e.shared[str(k)] = SharedDaemon(
            str(d["pipeDir"]),
            str(d.get("gpu") or ""),
            None if before is None else int(before),
            {str(s): str(c) for s, c in dict(d.get("members") or {}).items()},
        )
    return e
