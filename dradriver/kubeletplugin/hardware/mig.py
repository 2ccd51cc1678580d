"""The MIG steps of prepare and unprepare: carve the allocated partition, destroy it
after, and switch MIG mode on (and back off) where the product allows it; an instance is
recorded before it can exist (docs/design.md, "MIG carved on demand"). And what a start
does about MIG: the partitions of prepared claims carved again where a reboot cleared
them, carves a crash interrupted settled from the ledger, and instances this driver did
not make reported and left alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dradriver.crashpoints import crashpoint
from dradriver.errors import MigError
from dradriver.inventory.node_devices import MigSwitching
from dradriver.kubeletplugin.state.ledger import Ledger, OwnedInstance
from dradriver.kubeletplugin.state.records import Carve, ClaimRecord, PreparedDevice
from dradriver.logs import get_logger
from dradriver.nvml.mig import Created, Instance, MigCarver

log = get_logger("kubeletplugin.mig")

_INSUFFICIENT = (
    "; another GPU instance on this GPU holds memory slices, compute slices or media "
    "engines (NVDEC, NVENC, JPEG, OFA) this profile needs. The published counters keep the "
    "scheduler from allocating such a pair, so look for GPU instances made outside the "
    "driver (`nvidia-smi mig -lgi`); the plugin publishes around them from its next discovery on"
)


def slot_of(c: Carve) -> tuple[str, int, int]:
    """(GPU UUID, profile ID, placement): what is known before the carve."""
    return c.gpu_uuid, c.profile_id, c.placement_start


def _carved(d: PreparedDevice, made: Created) -> PreparedDevice:
    """The device as carved: its partition's instance ids and its MIG UUID."""
    assert d.carve is not None
    carve = dataclasses.replace(
        d.carve, gpu_instance_id=made.gpu_instance_id, compute_instance_id=made.compute_instance_id
    )
    return dataclasses.replace(d, carve=carve, uuid=made.uuid)


@dataclass
class MigPreparer:
    carver: MigCarver
    ledger: Ledger
    switching: MigSwitching = MigSwitching.ON_DEMAND

    def ensure_whole(
        self, gpu_uuid: str, profile_ids: list[int], device: str, *, claim: str = ""
    ) -> None:
        """A whole GPU is never handed out in MIG mode: switch it off where this driver
        may and no MIG device is on it, or fail naming the GPU."""
        if not self.carver.mig_enabled(gpu_uuid):
            return
        if self.switching is MigSwitching.NEVER:
            raise MigError(
                f"GPU {gpu_uuid} ({device}) is in MIG mode and --mig-mode-switching=never: "
                "it cannot be given whole; disable MIG mode on it, or ask for a MIG device"
            )
        if self.carver.instances(gpu_uuid, profile_ids):
            raise MigError(
                f"GPU {gpu_uuid} ({device}) has MIG devices, so it cannot be given whole"
            )
        # Recorded first: if the switch half-happens, unprepare and startup still know
        # the mode is ours to switch back on.
        self.ledger.mig_disabling(gpu_uuid, claim)
        self.carver.set_mig_mode(gpu_uuid, False)
        log.info("MIG mode switched off for a whole-GPU claim", gpu=gpu_uuid, device=device)

    def restore_disabled(
        self, gpus: set[str], held_whole: set[str], keep_for: set[str] | None = None
    ) -> None:
        """Switch MIG mode back on where this driver switched it off and no claim holds
        the GPU whole any more; not where it was switched off for a claim in `keep_for`
        (one whose record was lost but whose pod may still use the GPU)."""
        owners = self.ledger.load().mig_disabled
        for gpu in sorted((gpus & owners.keys()) - held_whole):
            if keep_for and owners[gpu] in keep_for:
                log.warning(
                    "MIG mode kept off: switched off for a claim the checkpoint does not "
                    "hold; switched back on when the kubelet unprepares it",
                    gpu=gpu,
                    claim_uid=owners[gpu],
                )
            else:
                self._switch_back(gpu, on=True)

    def restore_modes(self, gpus: set[str], all_profiles: dict[str, list[int]]) -> None:
        """Switch MIG mode back off where we switched it on and nothing is left."""
        for gpu in sorted(gpus & self.ledger.load().mig_enabled):
            if not self.carver.instances(gpu, all_profiles.get(gpu, [])):
                self._switch_back(gpu, on=False)

    def _switch_back(self, gpu: str, *, on: bool) -> None:
        """MIG mode back to what it was before this driver switched it, then out of the
        ledger; a failure is logged and leaves the entry for the next try."""
        word = "on" if on else "off"
        try:
            self.carver.set_mig_mode(gpu, on)
        except MigError as exc:
            log.error(f"could not switch MIG mode back {word}", gpu=gpu, error=str(exc))
            return
        restored = self.ledger.mig_disabled_restored if on else self.ledger.mig_enabled_restored
        restored(gpu)
        log.info(f"MIG mode restored to {word}", gpu=gpu)

    def carve(self, d: PreparedDevice, claim: str = "") -> PreparedDevice:
        """Creates the partition recorded in d.carve: the device with its ids and its
        MIG UUID."""
        c = d.carve
        assert c is not None
        if not self.carver.mig_enabled(c.gpu_uuid):
            # Recorded first, like every change we make: if switching fails half-way,
            # rollback and startup still know the mode is ours to switch back.
            self.ledger.mig_enabling(c.gpu_uuid)
            self.carver.set_mig_mode(c.gpu_uuid, True)
            log.info("MIG mode enabled", gpu=c.gpu_uuid, device=d.device)
        crashpoint("mig-before-create")
        slot = slot_of(c)
        if (kept := self._adopt_own(d, c, claim)) is not None:
            return kept
        if (there := self.at(slot)) is not None:
            # Not ours (the ledger holds nothing there): its placement is taken, and an
            # intent recorded now would make it look like ours to the undo.
            raise MigError(
                f"device {d.device} ({c.profile} at {c.placement_start}): GPU instance "
                f"{there.gpu_instance_id} not made by this driver already sits there"
                + _INSUFFICIENT
            )
        self.ledger.intending(slot, claim)
        crashpoint("mig-intent-ledgered")
        try:
            # A failure leaves the intent: the rollback destroys what the call could not
            # (a GPU instance whose own cleanup failed), or drops the intent if nothing is there.
            made = self.carver.create(*slot, size=c.placement_size, compute_slices=c.compute_slices)
        except MigError as err:
            raise MigError(
                f"device {d.device} ({c.profile} at {c.placement_start}): {err}"
                + (_INSUFFICIENT if "InsufficientResources" in str(err) else ""),
                in_use=err.in_use,
            ) from err
        self.ledger.instance_created(
            OwnedInstance(c.gpu_uuid, made.gpu_instance_id, c.profile_id, c.placement_start, claim)
        )
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
        return _carved(d, made)

    def _adopt_own(self, d: PreparedDevice, c: Carve, claim: str) -> PreparedDevice | None:
        """A partition the ledger says was carved for this same claim, whose record was
        lost: the claim's pods may be using it, so it is taken back as it is (same MIG
        UUID), never carved anew. One carved for another lost claim is refused."""
        slot = slot_of(c)
        held = next((i for i in self.ledger.load().instances if i.slot == slot), None)
        if held is None:
            return None
        gi_id = held.gpu_instance_id
        if gi_id is None:
            # An intent whose carve never finished (its claim's record lost): the
            # instance at its slot, if one is there, is that carve's.
            there = self.at(slot)
            if there is None:
                self.ledger.intent_dropped(slot)
                return None
            gi_id = there.gpu_instance_id
        if held.claim != claim:
            raise MigError(
                f"device {d.device} ({c.profile} at {c.placement_start}) is held for claim "
                f"UID {held.claim}, whose record was lost; it is released when the kubelet "
                "unprepares that claim"
            )
        made = self.carver.adopt(c.gpu_uuid, gi_id, c.profile_id)
        if made is None:
            if held.pending:
                # Half-made (no compute instance): not a device anyone can be using.
                self.carver.destroy(c.gpu_uuid, gi_id, None)
                self.ledger.intent_dropped(slot)
            else:
                self.ledger.instance_destroyed(c.gpu_uuid, gi_id)
            return None  # gone meanwhile: carve it anew
        if held.pending:
            self.ledger.instance_created(dataclasses.replace(held, gpu_instance_id=gi_id))
        log.warning(
            "MIG device of this claim kept from before its record was lost; taken back",
            claim_uid=claim,
            device=d.device,
            mig_uuid=made.uuid,
        )
        return _carved(d, made)

    def uncarve(self, d: PreparedDevice, claim: str = "") -> None:
        c = d.carve
        assert c is not None  # its step is there for a device with a carve only
        if c.gpu_instance_id is None:
            # Intent only: the instance at that placement is this attempt's if the ledger
            # says this claim made it, or began making it there (the intent is written
            # before the create). Anything else there (another claim's, an admin's) was
            # never ours to destroy.
            slot = slot_of(c)
            known = self.ledger.load()
            intended = known.intended_for(slot)
            inst = self.at(slot)
            if inst is None:
                if intended == claim:
                    self.ledger.intent_dropped(slot)
                return
            owner = known.owner(c.gpu_uuid, inst.gpu_instance_id) or intended
            if owner != claim:
                log.info(
                    "not destroying a MIG device this attempt did not create",
                    device=d.device,
                    claim_uid=claim,
                    holder=owner or "not this driver",
                )
                return
            self.carver.destroy(c.gpu_uuid, inst.gpu_instance_id, None)
            self.ledger.instance_destroyed(c.gpu_uuid, inst.gpu_instance_id)
            self.ledger.intent_dropped(slot)
        else:
            self.carver.destroy(c.gpu_uuid, c.gpu_instance_id, c.compute_instance_id)
            self.ledger.instance_destroyed(c.gpu_uuid, c.gpu_instance_id)
        log.info(
            "MIG device destroyed",
            gpu=c.gpu_uuid,
            device=d.device,
            profile=c.profile,
            placement=c.placement_start,
        )

    def release_forgotten(self, claim: str) -> set[str]:
        """Destroys the MIG instances the ledger says were made for `claim`, whose record
        is gone (a lost checkpoint); returns their GPUs. Raises MigError to be retried."""
        gpus: set[str] = set()
        for i in [i for i in self.ledger.load().instances if i.claim == claim]:
            gpus.add(i.gpu_uuid)
            there = self.at(i.slot)
            # A carve begun for it and never finished (no ID): what sits at its slot.
            # Otherwise only the instance we made: same ID, profile and placement (a GPU
            # instance ID is reused by whatever is carved at that placement later).
            if there is not None and i.gpu_instance_id in (None, there.gpu_instance_id):
                self.carver.destroy(i.gpu_uuid, there.gpu_instance_id, None)
            if i.gpu_instance_id is None:
                self.ledger.intent_dropped(i.slot)
                log.warning(
                    "half-made MIG device of a claim the checkpoint had lost destroyed",
                    claim_uid=claim,
                    gpu=i.gpu_uuid,
                    profile_id=i.profile_id,
                    placement=i.placement_start,
                    gpu_instance=there.gpu_instance_id if there is not None else "none",
                )
            else:
                self.ledger.instance_destroyed(i.gpu_uuid, i.gpu_instance_id)
                log.warning(
                    "MIG device of a claim the checkpoint had lost destroyed",
                    claim_uid=claim,
                    gpu=i.gpu_uuid,
                    gpu_instance=i.gpu_instance_id,
                )
        return gpus

    def at(self, slot: tuple[str, int, int]) -> Instance | None:
        """The GPU instance NVML reports at `slot`, whoever made it."""
        gpu, profile_id, placement = slot
        found = self.carver.instances(gpu, [profile_id])
        return next((i for i in found if i.placement_start == placement), None)

    # -- startup ---------------------------------------------------------------------------
    def reconcile(
        self, completed: list[ClaimRecord], all_profiles: dict[str, list[int]]
    ) -> list[ClaimRecord]:
        """Startup, after interrupted prepares are undone: carve again the partitions of
        completed claims that vanished (a reboot clears MIG), report foreign instances.
        The completed records as they are now (a partition carved again has new ids)."""
        owned: set[tuple[str, int | None]] = set()
        out = []
        for rec in completed:
            for i, d in enumerate(rec.devices):
                c = d.carve
                if c is None:
                    continue
                here = self.at(slot_of(c))
                if here is None or here.gpu_instance_id != c.gpu_instance_id:
                    log.warning(
                        "MIG device of a prepared claim is gone; carving it again",
                        device=d.device,
                        claim_uid=rec.uid,
                        gpu=c.gpu_uuid,
                    )
                    d = self.carve(d, rec.uid)  # its new ids
                    rec = rec.with_device(i, d)
                assert d.carve is not None
                owned.add((c.gpu_uuid, d.carve.gpu_instance_id))
            out.append(rec)
        self._settle_intents({r.uid for r in completed})
        ours = {(i.gpu_uuid, i.gpu_instance_id): i.claim for i in self.ledger.load().instances}
        for gpu, pids in all_profiles.items():
            for f in self.carver.instances(gpu, pids):
                if (gpu, f.gpu_instance_id) in owned:
                    continue
                claim = ours.get((f.gpu_uuid, f.gpu_instance_id))
                if claim is None:
                    log.warning(
                        "MIG device not created by this driver; left alone",
                        gpu=f.gpu_uuid,
                        gpu_instance=f.gpu_instance_id,
                        profile_id=f.profile_id,
                        placement=f.placement_start,
                    )
                else:
                    log.warning(
                        "MIG device of a claim the checkpoint does not hold: kept (not offered) "
                        "until the kubelet unprepares the claim",
                        gpu=f.gpu_uuid,
                        gpu_instance=f.gpu_instance_id,
                        claim_uid=claim,
                    )
        return out

    def _settle_intents(self, known: set[str]) -> None:
        """Startup, after interrupted prepares are undone: every intent left in the ledger
        belongs to a claim whose record is gone (a lost checkpoint). An instance at its
        slot is that claim's (its pods may use it): recorded as its, kept and not offered
        until the kubelet unprepares the claim, given back if it is prepared again. An
        intent with nothing at its slot is dropped."""
        for i in [i for i in self.ledger.load().instances if i.pending]:
            try:
                there = self.at(i.slot)
            except MigError as exc:
                log.error(
                    "could not look for the MIG device of an unfinished carve; kept as intended",
                    claim_uid=i.claim,
                    gpu=i.gpu_uuid,
                    error=str(exc),
                )
                continue
            if there is None:
                self.ledger.intent_dropped(i.slot)
                log.info(
                    "intent of a carve that made nothing dropped",
                    claim_uid=i.claim,
                    gpu=i.gpu_uuid,
                    placement=i.placement_start,
                )
                continue
            self.ledger.instance_created(
                dataclasses.replace(i, gpu_instance_id=there.gpu_instance_id)
            )
            log.warning(
                "MIG device whose carve a crash interrupted, of a claim the checkpoint does "
                "not hold: recorded as that claim's, kept until the kubelet unprepares it",
                claim_uid=i.claim,
                gpu=i.gpu_uuid,
                gpu_instance=there.gpu_instance_id,
                placement=i.placement_start,
                in_checkpoint=i.claim in known,
            )
