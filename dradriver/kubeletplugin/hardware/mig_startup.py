"""What a start does about MIG: the partitions of prepared claims carved again where a
reboot cleared them, carves a crash interrupted settled from the ledger, and
instances this driver did not make reported and left alone."""

from __future__ import annotations

import dataclasses

from dradriver.errors import MigError
from dradriver.kubeletplugin.hardware.mig import MigPreparer, slot_of
from dradriver.kubeletplugin.state.records import ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.mig")


def reconcile(
    mig: MigPreparer, completed: list[ClaimRecord], all_profiles: dict[str, list[int]]
) -> list[ClaimRecord]:
    """Startup, after interrupted prepares are undone: carve again the partitions of
    completed claims that vanished (a reboot clears MIG), report foreign instances.
    The completed records as they are now (a partition carved again has new ids)."""
    owned: set[tuple[str, int]] = set()
    out = []
    for rec in completed:
        for i, d in enumerate(rec.devices):
            c = d.carve
            if c is None:
                continue
            here = mig.at(slot_of(c))
            if here is not None and here.gpu_instance_id == c.gpu_instance_id:
                owned.add((c.gpu_uuid, here.gpu_instance_id))
                continue
            log.warning(
                "MIG device of a prepared claim is gone; carving it again",
                device=d.device,
                claim_uid=rec.uid,
                gpu=c.gpu_uuid,
            )
            carved = mig.carve(d, rec.uid)
            rec = rec.with_device(i, carved)
            assert carved.carve is not None and carved.carve.gpu_instance_id is not None
            owned.add((c.gpu_uuid, carved.carve.gpu_instance_id))
        out.append(rec)
    _settle_intents(mig, {r.uid for r in completed})
    foreign = [
        inst
        for gpu, pids in all_profiles.items()
        for inst in mig.carver.instances(gpu, pids)
        if (gpu, inst.gpu_instance_id) not in owned
    ]
    ours = {(i.gpu_uuid, i.gpu_instance_id): i.claim for i in mig.ledger.load().instances}
    for f in foreign:
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


def _settle_intents(mig: MigPreparer, known: set[str]) -> None:
    """Startup, after interrupted prepares are undone: every intent left in the ledger
    belongs to a claim whose record is gone (a lost checkpoint). An instance at its
    slot is that claim's (its pods may use it): recorded as its, kept and not offered
    until the kubelet unprepares the claim, given back if it is prepared again. An
    intent with nothing at its slot is dropped."""
    for i in [i for i in mig.ledger.load().instances if i.pending]:
        try:
            there = mig.at(i.slot)
        except MigError as exc:
            log.error(
                "could not look for the MIG device of an unfinished carve; kept as intended",
                claim_uid=i.claim,
                gpu=i.gpu_uuid,
                error=str(exc),
            )
            continue
        if there is None:
            mig.ledger.intent_dropped(i.slot)
            log.info(
                "intent of a carve that made nothing dropped",
                claim_uid=i.claim,
                gpu=i.gpu_uuid,
                placement=i.placement_start,
            )
            continue
        mig.ledger.instance_created(dataclasses.replace(i, gpu_instance_id=there.gpu_instance_id))
        log.warning(
            "MIG device whose carve a crash interrupted, of a claim the checkpoint does "
            "not hold: recorded as that claim's, kept until the kubelet unprepares it",
            claim_uid=i.claim,
            gpu=i.gpu_uuid,
            gpu_instance=there.gpu_instance_id,
            placement=i.placement_start,
            in_checkpoint=i.claim in known,
        )
