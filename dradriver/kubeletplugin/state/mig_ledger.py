"""What this driver changed in MIG, on disk and apart from the checkpoint (MigModeLedger):
the GPUs whose MIG mode it switched, and the instances it created, so that a lost
checkpoint loses nothing and a restart can tell our instances from foreign ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dradriver.kubeletplugin.state.files import FileLock, atomic_write
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.mig")


@dataclass(frozen=True)
class OwnedInstance:
    """A MIG instance this driver created, and for which claim. Before the carve its GPU
    instance ID is not known yet (None): the intent, written before NVML is asked, so an
    instance a kill leaves half-made is still ours (found by GPU, profile and placement)."""

    gpu_uuid: str
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


@dataclass
class _LedgerDoc:
    enabled: set[str] = field(default_factory=set)
    disabled: set[str] = field(default_factory=set)
    disabled_for: dict[str, str] = field(default_factory=dict)  # GPU -> claim, where known
    instances: list[OwnedInstance] = field(default_factory=list)


class MigModeLedger:
    """What this driver changed in MIG, kept apart from the checkpoint so that a lost
    checkpoint loses nothing:
    - GPUs whose MIG mode it switched: on for a partition (switched back off when its last
      partition there is gone), or off for a whole GPU (switched back on when that claim
      is gone). Recorded before each switch, so a crash never leaves a mode nobody knows
      it changed; a mode an admin chose is never touched;
    - the MIG instances it created, with their claim: never offered to another claim while
      they exist, and destroyed when the kubelet unprepares that claim, even if its record
      is gone. Each is written before the carve as an intent (GPU, profile, placement; no
      GPU instance ID yet: an older release skips such an entry) and completed with its
      ID right after, so a kill at any instant leaves no instance nobody owns.
    Each change is one read and one atomic write of the file, under the ledger's own
    lock: prepares on different GPUs change it at the same time (threads of this
    instance, or the other instance during a rolling update), and a change made from a
    stale read would drop the other's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = FileLock(path.with_name(path.name + ".lock"))

    def _update(self, change: Callable[[_LedgerDoc], bool]) -> None:
        """Read, change (returns whether it changed anything), write: one at a time."""
        with self._lock:
            doc = self._read()
            if change(doc):
                self._write(doc)

    def _read(self) -> _LedgerDoc:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            return _LedgerDoc()
        if not isinstance(data, dict):
            return _LedgerDoc()
        owners = data.get("disabledFor", {})
        doc = _LedgerDoc(
            set(data.get("enabledByDriver", [])),
            set(data.get("disabledByDriver", [])),
            {str(k): str(v) for k, v in owners.items()} if isinstance(owners, dict) else {},
        )
        for raw in data.get("instances", []):
            try:
                gi = raw.get("gpuInstanceId")
                doc.instances.append(
                    OwnedInstance(
                        str(raw["gpuUUID"]),
                        None if gi is None else int(gi),
                        int(raw["profileId"]),
                        int(raw["placementStart"]),
                        str(raw["claim"]),
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return doc

    def _write(self, doc: _LedgerDoc) -> None:
        data = {
            "enabledByDriver": sorted(doc.enabled),
            "disabledByDriver": sorted(doc.disabled),
            "disabledFor": {g: c for g, c in doc.disabled_for.items() if g in doc.disabled},
            "instances": [
                {
                    "gpuUUID": i.gpu_uuid,
                    "gpuInstanceId": i.gpu_instance_id,
                    "profileId": i.profile_id,
                    "placementStart": i.placement_start,
                    "claim": i.claim,
                }
                for i in doc.instances
            ],
        }
        atomic_write(self.path, json.dumps(data).encode(), 0o600)

    def load(self) -> set[str]:
        """GPUs this driver switched MIG mode on."""
        return self._read().enabled

    def load_disabled(self) -> set[str]:
        """GPUs this driver switched MIG mode off, for a whole-GPU claim."""
        return self._read().disabled

    def disabled_for(self) -> dict[str, str]:
        """GPU -> the claim it was switched off for (where known)."""
        return self._read().disabled_for

    def instances(self) -> list[OwnedInstance]:
        return self._read().instances

    def owner(self, gpu_uuid: str, gpu_instance_id: int) -> str | None:
        """The claim this driver created that GPU instance for, if it did."""
        return next(
            (
                i.claim
                for i in self.instances()
                if (i.gpu_uuid, i.gpu_instance_id) == (gpu_uuid, gpu_instance_id)
            ),
            None,
        )

    def intended_for(self, slot: tuple[str, int, int]) -> str | None:
        """The claim a carve at `slot` (GPU, profile, placement) was begun for and not
        known to have finished or been undone: the instance there, if any, is its."""
        return next((i.claim for i in self.instances() if i.pending and i.slot == slot), None)

    def intending(self, slot: tuple[str, int, int], claim: str) -> None:
        """Recorded before the carve at `slot` for `claim` (replacing a stale intent)."""
        gpu, profile, placement = slot

        def change(doc: _LedgerDoc) -> bool:
            doc.instances = [i for i in doc.instances if not (i.pending and i.slot == slot)]
            doc.instances.append(OwnedInstance(gpu, None, profile, placement, claim))
            return True

        self._update(change)

    def intent_dropped(self, slot: tuple[str, int, int]) -> None:
        """Nothing was made at `slot` (or it is destroyed): the intent goes."""

        def change(doc: _LedgerDoc) -> bool:
            kept = [i for i in doc.instances if not (i.pending and i.slot == slot)]
            changed = len(kept) != len(doc.instances)
            doc.instances = kept
            return changed

        self._update(change)

    def enabling(self, gpu: str) -> None:
        """Recorded before MIG mode is switched on on `gpu` for a partition."""
        self._update(lambda doc: _added(doc.enabled, gpu))

    def enabled_restored(self, gpu: str) -> None:
        """MIG mode is off again on `gpu`, as it was before this driver switched it on."""
        self._update(lambda doc: _removed(doc.enabled, gpu))

    def disabling(self, gpu: str, claim: str) -> None:
        """Recorded before MIG mode is switched off on `gpu` for `claim`'s whole GPU."""

        def change(doc: _LedgerDoc) -> bool:
            doc.disabled.add(gpu)
            doc.disabled_for[gpu] = claim
            return True

        self._update(change)

    def disabled_restored(self, gpu: str) -> None:
        """MIG mode is on again on `gpu`, as it was before this driver switched it off."""
        self._update(lambda doc: _removed(doc.disabled, gpu))

    def instance_created(self, inst: OwnedInstance) -> None:
        """The instance exists with its ID: replaces the intent at its slot."""

        def change(doc: _LedgerDoc) -> bool:
            doc.instances = [
                i
                for i in doc.instances
                if (i.gpu_uuid, i.gpu_instance_id) != (inst.gpu_uuid, inst.gpu_instance_id)
                and not (i.pending and i.slot == inst.slot)
            ] + [inst]
            return True

        self._update(change)

    def instance_destroyed(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        def change(doc: _LedgerDoc) -> bool:
            kept = [
                i
                for i in doc.instances
                if (i.gpu_uuid, i.gpu_instance_id) != (gpu_uuid, gpu_instance_id)
            ]
            changed = len(kept) != len(doc.instances)
            doc.instances = kept
            return changed

        self._update(change)


def _added(into: set[str], item: str) -> bool:
    if item in into:
        return False
    into.add(item)
    return True


def _removed(source: set[str], item: str) -> bool:
    if item not in source:
        return False
    source.discard(item)
    return True


def held_instances(
    ledger: MigModeLedger, owned: set[tuple[str, int, int]]
) -> set[tuple[str, int, int]]:
    """(GPU UUID, profile ID, placement) of instances this driver made for claims the
    checkpoint does not hold: not offered to anyone until those claims are unprepared."""
    return {
        (i.gpu_uuid, i.profile_id, i.placement_start)
        for i in ledger.instances()
        if (i.gpu_uuid, i.profile_id, i.placement_start) not in owned
    }
