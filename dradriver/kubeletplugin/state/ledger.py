"""The ledger (<state dir>/ledger.json): what the driver changed on the node and must undo
even if the checkpoint is lost or moved aside as corrupt: MIG modes switched, MIG
instances created (an intent before the carve, its ID right after), compute modes
changed (the mode before, written once), intervals set, shares' daemons and their
members, IMEX daemons and their claims. Each entry is written *before* the change and
removed only once it is undone, so a kill at any instant leaves nothing nobody knows was
changed; startup and the kubelet's unprepare of a forgotten claim undo what it holds. The
keys and why each fact lives here rather than in the checkpoint: docs/design.md, "What
the node writes".

Every change is one read-modify-write under the ledger's lock (Ledger._update): prepares
on different GPUs change it at once (threads, or the other instance during a rolling
update). Loading never raises: an unreadable ledger is moved aside and reported, and the
driver carries on with an empty one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.kubeletplugin.state.files import (
    FileLock,
    LockTimeout,
    atomic_write,
    from_json,
    move_aside,
    to_json,
)
from dradriver.kubeletplugin.state.records import ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.ledger")

VERSION = 1
FILE_NAME = "ledger.json"


@dataclass(frozen=True)
class OwnedInstance:
    """A MIG instance this driver created, and for which claim. Before the carve its GPU
    instance ID is not known yet (None): the intent, written before NVML is asked, so an
    instance a kill leaves half-made is still ours (found by GPU, profile and placement)."""

    gpu_uuid: str = field(metadata={"key": "gpuUUID"})
    gpu_instance_id: int | None
    profile_id: int
    placement_start: int
    claim: str

    @property
    def slot(self) -> tuple[str, int, int]:
        """(GPU UUID, profile ID, placement): what is known before the carve."""
        return self.gpu_uuid, self.profile_id, self.placement_start

    @property
    def pending(self) -> bool:
        return self.gpu_instance_id is None


@dataclass(frozen=True)
class ModeChange:
    before: int  # NVML_COMPUTEMODE_*
    claim: str


@dataclass(frozen=True)
class SharedDaemon:
    """A device's shares' MPS daemon (its directories are named for the device:
    hardware/shares.py)."""

    gpu: str  # the GPU whose compute mode it changed; "" for a MIG device
    mode_before: int | None  # that GPU's mode before; None when unchanged
    members: dict[str, str] = field(default_factory=dict)  # share ID -> claim


# Every key is written, empty or not: the file reads the same whatever it holds.
_ALWAYS = {"always": True}


@dataclass
class Entries:
    mig_enabled: set[str] = field(default_factory=set, metadata=_ALWAYS)
    mig_disabled: dict[str, str] = field(default_factory=dict, metadata=_ALWAYS)  # GPU -> claim
    instances: list[OwnedInstance] = field(
        default_factory=list, metadata={**_ALWAYS, "key": "migInstances"}
    )
    compute_mode: dict[str, ModeChange] = field(default_factory=dict, metadata=_ALWAYS)
    time_slice: dict[str, str] = field(default_factory=dict, metadata=_ALWAYS)  # GPU -> claim
    # device UUID -> daemon
    shared: dict[str, SharedDaemon] = field(
        default_factory=dict, metadata={**_ALWAYS, "key": "shareDaemons"}
    )
    # ComputeDomain UID -> the claim its IMEX daemon (imex/<UID>/, its pod) was started for
    imex: dict[str, str] = field(default_factory=dict, metadata={**_ALWAYS, "key": "imexDaemons"})

    def claims(self) -> set[str]:
        """Every claim something is held for: a MIG instance or mode, sharing, an IMEX
        daemon."""
        mig = {i.claim for i in self.instances} | set(self.mig_disabled.values())
        return (mig | self.sharing_claims() | set(self.imex.values())) - {""}

    def sharing_claims(self) -> set[str]:
        """The claims a compute mode, a time slice or a share is held for."""
        return (
            {m.claim for m in self.compute_mode.values()}
            | set(self.time_slice.values())
            | {c for d in self.shared.values() for c in d.members.values()}
        )

    def owner(self, gpu_uuid: str, gpu_instance_id: int) -> str | None:
        """The claim this driver created that GPU instance for, if it did."""
        key = (gpu_uuid, gpu_instance_id)
        return next(
            (i.claim for i in self.instances if (i.gpu_uuid, i.gpu_instance_id) == key), None
        )

    def intended_for(self, slot: tuple[str, int, int]) -> str | None:
        """The claim a carve at `slot` (GPU, profile, placement) was begun for and not
        known to have finished or been undone: the instance there, if any, is its."""
        return next((i.claim for i in self.instances if i.pending and i.slot == slot), None)


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(path.with_name(path.name + ".lock"))

    @classmethod
    def of(cls, state_dir: Path) -> Ledger:
        """The ledger of the state directory `state_dir`."""
        return cls(state_dir / FILE_NAME)

    # -- reading and writing ---------------------------------------------------------------
    def load(self) -> Entries:
        """What the ledger holds; empty (the file moved aside, reported) if unreadable."""
        if isinstance(e := self._read(), Entries):
            return e
        with self._lock:  # moved aside by one reader, never over a writer's new file
            return self._read_or_aside()

    def _read(self) -> Entries | str:
        """The entries, or why they cannot be read."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Entries()
        except (OSError, ValueError, RecursionError) as exc:
            return f"unreadable: {exc}"
        if not isinstance(doc, dict):
            return "unexpected content: not an object"
        if not isinstance(version := doc.get("version"), int) or version < 1:
            return f"unexpected content: version {version!r}"
        # A newer release's ledger is read for the keys this one knows: entries are only ever
        # undone, so reading fewer never changes what the newer release still uses.
        try:
            entries: Entries = from_json(Entries, doc, "ledger")
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            return f"unexpected content: {exc}"
        return entries

    def _read_or_aside(self) -> Entries:
        """Under the lock: the entries, or none, the unreadable file moved aside."""
        if isinstance(e := self._read(), Entries):
            return e
        log.error(
            "LEDGER UNREADABLE: what the driver changed on this node is no longer known: "
            "MIG modes it switched, MIG instances it made, compute modes and time slices it "
            "set may need undoing by hand (`nvidia-smi mig -lgi`, `nvidia-smi -c DEFAULT`)",
            path=str(self.path),
            reason=e,
            moved_to=move_aside(self.path),
        )
        return Entries()

    def _update(self, change: Callable[[Entries], object]) -> Entries:
        """Read, change, write (only if it changed anything), all under the lock, so that
        no writer saves a stale read over another's change. The entries after."""
        with self._lock:
            e = self._read_or_aside()
            before = to_json(e)
            change(e)
            if to_json(e) != before:
                doc = json.dumps({"version": VERSION, **to_json(e)}, sort_keys=True)
                atomic_write(self.path, doc.encode(), 0o600)
            return e

    # -- MIG -------------------------------------------------------------------------------
    def mig_enabling(self, gpu: str) -> None:
        """Recorded before MIG mode is switched on on `gpu` for a partition."""
        self._update(lambda e: e.mig_enabled.add(gpu))

    def mig_enabled_restored(self, gpu: str) -> None:
        """MIG mode is off again on `gpu`, as it was before this driver switched it on."""
        self._update(lambda e: e.mig_enabled.discard(gpu))

    def mig_disabling(self, gpu: str, claim: str) -> None:
        """Recorded before MIG mode is switched off on `gpu` for `claim`'s whole GPU."""
        self._update(lambda e: e.mig_disabled.update({gpu: claim}))

    def mig_disabled_restored(self, gpu: str) -> None:
        """MIG mode is on again on `gpu`, as it was before this driver switched it off."""
        self._update(lambda e: e.mig_disabled.pop(gpu, None))

    def intending(self, slot: tuple[str, int, int], claim: str) -> None:
        """Recorded before the carve at `slot` for `claim` (replacing a stale intent)."""
        gpu, profile, placement = slot
        self._instances(slot, add=OwnedInstance(gpu, None, profile, placement, claim))

    def intent_dropped(self, slot: tuple[str, int, int]) -> None:
        """Nothing was made at `slot` (or it is destroyed): the intent goes."""
        self._instances(slot)

    def instance_created(self, inst: OwnedInstance) -> None:
        """The instance exists with its ID: replaces the intent at its slot."""
        self._instances(inst.slot, made=(inst.gpu_uuid, inst.gpu_instance_id), add=inst)

    def instance_destroyed(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        self._instances(None, made=(gpu_uuid, gpu_instance_id))

    def _instances(
        self,
        intent: tuple[str, int, int] | None,
        *,
        made: tuple[str, int | None] | None = None,
        add: OwnedInstance | None = None,
    ) -> None:
        """Drops the intent at slot `intent` and the instance `made` (GPU UUID, GPU
        instance ID), then adds `add`."""

        def change(e: Entries) -> None:
            e.instances = [
                i
                for i in e.instances
                if not (i.pending and i.slot == intent) and (i.gpu_uuid, i.gpu_instance_id) != made
            ] + ([add] if add else [])

        self._update(change)

    # -- sharing ---------------------------------------------------------------------------
    def mode_changing(self, gpu: str, before: int, claim: str) -> int:
        """Records, before the change, the mode `gpu` had; returns the recorded one (an
        earlier record wins: it is what the GPU had before this driver touched it)."""
        e = self._update(lambda e: e.compute_mode.setdefault(gpu, ModeChange(before, claim)))
        return e.compute_mode[gpu].before

    def mode_restored(self, gpu: str) -> None:
        self._update(lambda e: e.compute_mode.pop(gpu, None))

    def slice_changing(self, gpu: str, claim: str) -> None:
        self._update(lambda e: e.time_slice.update({gpu: claim}))

    def slice_restored(self, gpu: str) -> None:
        self._update(lambda e: e.time_slice.pop(gpu, None))

    def shared_daemon(self, device: str, *, gpu: str, mode_before: int | None) -> SharedDaemon:
        """Records the device's shared daemon before it starts, keeping its members and
        the first mode recorded for its GPU."""

        def change(e: Entries) -> None:
            old = e.shared.get(device)
            before = old.mode_before if old is not None and old.gpu == gpu else mode_before
            members = dict(old.members) if old is not None else {}
            e.shared[device] = SharedDaemon(gpu, before, members)

        return self._update(change).shared[device]

    def member(self, device: str, share: str, claim: str | None) -> SharedDaemon | None:
        """Adds (claim) or removes (None) a share of the device's daemon; what is left."""

        def change(e: Entries) -> None:
            if (d := e.shared.get(device)) is not None:
                members = {s: c for s, c in d.members.items() if s != share}
                if claim is not None:
                    members[share] = claim
                e.shared[device] = dataclasses.replace(d, members=members)

        return self._update(change).shared.get(device)

    def shared_stopped(self, device: str) -> None:
        self._update(lambda e: e.shared.pop(device, None))

    # -- IMEX ------------------------------------------------------------------------------
    def imex_starting(self, domain_uid: str, claim: str) -> None:
        """Recorded before the daemon of ComputeDomain `domain_uid` is configured and
        started for `claim` (one daemon per domain on a node)."""
        self._update(lambda e: e.imex.update({domain_uid: claim}))

    def imex_stopped(self, domain_uid: str) -> None:
        self._update(lambda e: e.imex.pop(domain_uid, None))


def held_instances(ledger: Ledger, owned: set[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
    """(GPU UUID, profile ID, placement) of instances this driver made for claims the
    checkpoint does not hold: not offered to anyone until those claims are unprepared."""
    return {i.slot for i in ledger.load().instances if i.slot not in owned}


def record_gpus(rec: ClaimRecord) -> set[str]:
    """What a claim's hardware work touches: the GPU a partition is carved on, a whole
    GPU (MIG mode, compute mode, time slice), an existing MIG device (its daemon)."""
    carved = {d.carve.gpu_uuid for d in rec.devices if d.carve is not None}
    return carved | {d.uuid for d in rec.devices if d.carve is None and d.uuid}


class GpuLocks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._locks: dict[str, FileLock] = {}
        self._made = threading.Lock()

    def _lock(self, gpu: str) -> FileLock:
        with self._made:
            if gpu not in self._locks:
                # A UUID is "GPU-" or "MIG-" and hex: safe as a file name.
                self._locks[gpu] = FileLock(self.directory / f"{gpu}.lock")
            return self._locks[gpu]

    def hold(self, gpus: Iterable[str], timeout: float | None = None) -> contextlib.ExitStack:
        """Every GPU's lock, in sorted order, as a stack to close (or to enter as a
        context); waits for each (or raises LockTimeout after `timeout`)."""
        with contextlib.ExitStack() as held:  # released again if one cannot be had
            for gpu in sorted(set(gpus)):
                lock = self._lock(gpu)
                lock.acquire(timeout)
                held.callback(lock.release)
            return held.pop_all()

    def try_hold(self, gpus: Iterable[str]) -> contextlib.ExitStack | None:
        """Every GPU's lock without waiting (the caller may hold the node lock), as a
        stack to close; None if any is held, by a thread of this instance or by the other
        instance: its hardware work on that GPU is in progress."""
        try:
            return self.hold(gpus, timeout=0)
        except LockTimeout:
            return None
