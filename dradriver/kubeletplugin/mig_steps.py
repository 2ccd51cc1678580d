"""The MIG steps of prepare and unprepare: carve the allocated partition, destroy it
after, and switch MIG mode on (and back off) where the product allows it.

The planner records the intent (GPU, profile, placement) in the claim's record before
any of this runs, and the executor saves the created instance ids right after, so startup
can always tell our instances from foreign ones and finish or undo what a crash
interrupted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dradriver.crashpoints import crashpoint
from dradriver.kubeletplugin.files import atomic_write
from dradriver.kubeletplugin.records import Carve, ClaimRecord, PreparedDevice
from dradriver.logs import get_logger
from dradriver.nvml.mig import Instance, MigCarver, MigError

log = get_logger("kubeletplugin.mig")


class MigModeLedger:
    """GPUs on which this driver switched MIG mode on, so it can switch it back off when
    its last partition there is gone (and never touch a mode an admin chose)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> set[str]:
        try:
            return set(json.loads(self.path.read_text()).get("enabledByDriver", []))
        except (OSError, ValueError, AttributeError):
            return set()

    def save(self, uuids: set[str]) -> None:
        atomic_write(self.path, json.dumps({"enabledByDriver": sorted(uuids)}).encode(), 0o600)


@dataclass
class MigPreparer:
    carver: MigCarver
    ledger: MigModeLedger

    def carve(self, d: PreparedDevice) -> None:
        """Creates the partition recorded in d.carve; fills in its ids and the MIG UUID."""
        c = d.carve
        assert c is not None
        if not self.carver.mig_enabled(c.gpu_uuid):
            # Recorded first, like every change we make: if switching fails half-way,
            # rollback and startup still know the mode is ours to switch back.
            self.ledger.save(self.ledger.load() | {c.gpu_uuid})
            self.carver.set_mig_mode(c.gpu_uuid, True)
            log.info("MIG mode enabled", gpu=c.gpu_uuid, device=d.device)
        crashpoint("mig-before-create")
        made = self.carver.create(
            c.gpu_uuid, c.profile_id, c.placement_start, c.placement_size, c.compute_slices
        )
        c.gpu_instance_id, c.compute_instance_id = made.gpu_instance_id, made.compute_instance_id
        d.uuid = made.uuid
        log.info(
            "MIG device created",
            gpu=c.gpu_uuid,
            device=d.device,
            profile=c.profile,
            placement=c.placement_start,
            gpu_instance=made.gpu_instance_id,
            mig_uuid=made.uuid,
        )
        crashpoint("mig-created")

    def uncarve(self, d: PreparedDevice) -> None:
        c = d.carve
        if c is None:
            return
        if c.gpu_instance_id is None:
            inst = self.find(c)  # intent only: destroy what exists at that placement
            if inst is not None:
                self.carver.destroy(c.gpu_uuid, inst.gpu_instance_id, None)
        else:
            self.carver.destroy(c.gpu_uuid, c.gpu_instance_id, c.compute_instance_id)
        log.info(
            "MIG device destroyed",
            gpu=c.gpu_uuid,
            device=d.device,
            profile=c.profile,
            placement=c.placement_start,
        )

    def find(self, c: Carve) -> Instance | None:
        return next(
            (
                i
                for i in self.carver.instances(c.gpu_uuid, [c.profile_id])
                if i.placement_start == c.placement_start
            ),
            None,
        )

    def restore_modes(self, gpus: set[str], all_profiles: dict[str, list[int]]) -> None:
        """Switch MIG mode back off where we switched it on and nothing is left."""
        enabled = self.ledger.load()
        for gpu in sorted(gpus & enabled):
            if self.carver.instances(gpu, all_profiles.get(gpu, [])):
                continue
            try:
                self.carver.set_mig_mode(gpu, False)
            except MigError as exc:
                log.error("could not switch MIG mode back off", gpu=gpu, error=str(exc))
                continue
            enabled.discard(gpu)
            self.ledger.save(enabled)
            log.info("MIG mode restored to off", gpu=gpu)

    def reconcile(
        self,
        completed: list[ClaimRecord],
        undo: list[ClaimRecord],
        all_profiles: dict[str, list[int]],
    ) -> list[Instance]:
        """Startup: destroy what interrupted prepares created, carve again the partitions
        of completed claims that vanished (a reboot clears MIG), report foreign instances."""
        for rec in undo:
            for d in rec.devices:
                if d.carve is None:
                    continue
                try:
                    self.uncarve(d)
                except MigError as exc:
                    log.error(
                        "could not destroy an interrupted MIG device",
                        device=d.device,
                        claim_uid=rec.uid,
                        error=str(exc),
                    )
        owned: set[tuple[str, int]] = set()
        for rec in completed:
            for d in rec.devices:
                c = d.carve
                if c is None:
                    continue
                here = self.find(c)
                if here is not None and here.gpu_instance_id == c.gpu_instance_id:
                    owned.add((c.gpu_uuid, here.gpu_instance_id))
                    continue
                log.warning(
                    "MIG device of a prepared claim is gone; carving it again",
                    device=d.device,
                    claim_uid=rec.uid,
                    gpu=c.gpu_uuid,
                )
                self.carve(d)
                assert c.gpu_instance_id is not None
                owned.add((c.gpu_uuid, c.gpu_instance_id))
        foreign = [
            i
            for gpu, pids in all_profiles.items()
            for i in self.carver.instances(gpu, pids)
            if (gpu, i.gpu_instance_id) not in owned
        ]
        for i in foreign:
            log.warning(
                "MIG device not created by this driver; left alone",
                gpu=i.gpu_uuid,
                gpu_instance=i.gpu_instance_id,
                profile_id=i.profile_id,
                placement=i.placement_start,
            )
        return foreign
