"""Unprepare of a claim the checkpoint does not know: if its record was lost (a corrupt
checkpoint moved aside), the ledger and the CDI directory still know what was done for
it, and that is undone from them alone."""

from __future__ import annotations

import functools

from dradriver.errors import CdiError
from dradriver.kubeletplugin.prepare.execute import Executor, Step, ignoring, undo_all
from dradriver.kubeletplugin.state.records import PREPARE_STARTED, ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.execute")


def forgotten_gpus(ex: Executor, uid: str) -> set[str] | None:
    """The GPUs the ledger says this driver changed for claim `uid` (whose record is
    gone): what its release_forgotten touches; None if nothing is held for it."""
    steps = (ex.mig, ex.sharing, ex.shares, ex.imex)
    ledger = next((s.ledger for s in steps if s is not None), None)
    if ledger is None:
        return None
    e = ledger.load()  # one read: an IMEX daemon's claim is there too (on no GPU)
    gpus = {i.gpu_uuid for i in e.instances if i.claim == uid}
    gpus |= {g for g, c in e.mig_disabled.items() if c == uid}
    gpus |= {g for g, m in e.compute_mode.items() if m.claim == uid}
    gpus |= {g for g, c in e.time_slice.items() if c == uid}
    gpus |= {k for k, sd in e.shared.items() if uid in sd.members.values()}
    return gpus if uid in e.claims() else None


def release_forgotten(ex: Executor, uid: str, ref: str) -> None:
    """Unprepare of a claim the checkpoint does not know: if it was lost (a corrupt
    checkpoint moved aside), the ledger and the CDI directory still know what was
    done for the claim; undo that now. Nothing recorded: nothing to do."""
    steps: list[Step] = []
    if (mig := ex.mig) is not None:

        def mig_undo(_: ClaimRecord) -> None:
            gpus = mig.release_forgotten(uid)
            if gpus:
                mig.restore_modes(gpus, ex.profiles())
            off = {g for g, c in mig.ledger.load().mig_disabled.items() if c == uid}
            if off:
                mig.restore_disabled(off, set())

        steps.append(Step("MIG", "MIG devices and modes the ledger holds", mig_undo))
    if (sharing := ex.sharing) is not None:
        undo = ignoring(functools.partial(sharing.undo_forgotten_claim, uid))
        steps.append(Step("sharing", "time-slicing and MPS the ledger holds", undo))
    if (shares := ex.shares) is not None:
        undo = ignoring(functools.partial(shares.undo_forgotten, uid))
        steps.append(Step("shares", "shares the ledger holds", undo))
    if (imex := ex.imex) is not None:
        undo = ignoring(functools.partial(imex.undo_forgotten, uid))
        steps.append(Step("IMEX", "IMEX daemons", undo))
    spec = ignoring(functools.partial(remove_forgotten_spec, ex, uid, ref))
    steps.append(Step("CDI", "removing the CDI spec", spec))
    # Nothing is known of it but its name: a record of no device stands for it.
    namespace, _, name = ref.partition("/")
    failed = undo_all(steps, ClaimRecord(uid, namespace, name, PREPARE_STARTED))
    if failed is not None:
        raise failed


def remove_forgotten_spec(ex: Executor, uid: str, ref: str) -> None:
    """release_forgotten's last step, alone: for a claim forgotten_gpus found no
    ledger entry of (read under the same lock), nothing else is left to undo."""
    if ex.cdi_writer.exists(uid):
        try:
            ex.cdi_writer.remove(uid)
        except OSError as exc:
            raise CdiError(
                f"CDI layer: removing the spec of claim {ref} failed: {exc}", reason="cdi"
            ) from exc
        log.info("CDI spec of a claim the checkpoint had lost removed", claim_uid=uid)
