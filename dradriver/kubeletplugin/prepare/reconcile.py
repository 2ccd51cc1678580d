"""Startup: finish what a crash or a reboot left. Interrupted prepares are undone (MIG
instances included), completed claims get their MIG devices, MPS daemons and CDI specs
back, and spec files no claim owns are removed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from dradriver.errors import CdiError, MigError, SharingError
from dradriver.inventory.node_devices import NodeDevice
from dradriver.kubeletplugin.hardware import mig_startup
from dradriver.kubeletplugin.prepare.execute import Executor, undo_all
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore, reconcile_boot
from dradriver.kubeletplugin.state.checkpoint.store import InLock, held_whole
from dradriver.kubeletplugin.state.pod_limits import pod_totals
from dradriver.kubeletplugin.state.records import PREPARE_COMPLETED, Checkpoint, ClaimRecord
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.reconcile")


def reconcile(
    store: CheckpointStore, ex: Executor, devices: Callable[[], Mapping[str, NodeDevice]]
) -> Checkpoint:
    """Call under the node lock, before serving. Returns the checkpoint it saved."""
    boot = reconcile_boot(store.load())
    cp = boot.checkpoint
    for rec in boot.dropped + boot.interrupted:
        log.warning(
            "undoing an interrupted prepare", claim=rec.ref, claim_uid=rec.uid, state=rec.state
        )
        if undo_all(ex.steps(rec, InLock(cp, store)), rec) is None:
            cp.claims.pop(rec.uid, None)
        else:
            cp.claims[rec.uid] = rec  # kept, unfinished: the next prepare or start retries

    def saved(rec: ClaimRecord) -> None:
        cp.claims[rec.uid] = rec
        store.save(cp)

    # The completed claims, by UID: each step below reads the record as cp.claims holds it
    # now (a step before may have saved a new one) and saves the one it makes.
    completed = [uid for uid, r in cp.claims.items() if r.state == PREPARE_COMPLETED]
    if ex.mig is not None:
        try:
            carved = mig_startup.reconcile(ex.mig, [cp.claims[u] for u in completed], ex.profiles())
            cp.claims.update((r.uid, r) for r in carved)
        except MigError as exc:
            log.error("MIG reconciliation incomplete", error=str(exc))
    if ex.sharing is not None:
        # What the ledger holds for claims the checkpoint lost: kept for their pods,
        # undone when the kubelet unprepares them.
        ex.sharing.report_forgotten(set(cp.claims) | set(cp.unreadable))
    for steps in [s for s in (ex.sharing, ex.shares) if s is not None]:
        for uid in completed:
            try:
                steps.recheck(cp.claims[uid], saved)
            except SharingError as exc:
                log.error("could not restart an MPS daemon", claim_uid=uid, error=str(exc))
    if ex.pod_memory is not None:
        # Set again (the same values): a limit set before a crash may not have been saved.
        for uid in completed:
            limited = ex.pod_memory.apply(cp.claims[uid], functools.partial(_others, cp, uid))
            if limited is not None:
                saved(limited)
    if ex.imex is not None:
        # A reboot ended the IMEX daemons of the claims still prepared: started again.
        for uid in completed:
            ex.imex.ensure(cp.claims[uid], saved)
    local = devices()
    for rec in [cp.claims[uid] for uid in completed]:
        missing = [d.device for d in rec.devices if d.device not in local and d.imex is None]
        if missing:
            log.error(
                "prepared claim refers to devices this node no longer has",
                claim=rec.ref,
                claim_uid=rec.uid,
                devices=",".join(missing),
            )
        try:
            # Always rewritten: a reboot wipes /var/run/cdi, and a partition carved
            # again has a new MIG UUID. The driver spec they name: after discovery.
            ex.cdi_writer.write(rec.uid, ex.spec(rec))
        except (ValueError, OSError, CdiError) as exc:
            log.error(
                "CDI spec could not be restored", claim=rec.ref, claim_uid=rec.uid, error=str(exc)
            )
    # A spec without a record: only a lost checkpoint leaves one (a spec is written after
    # its record and removed before it), and its pod may be running. The kubelet's
    # unprepare of the claim removes it.
    lost = set(ex.cdi_writer.list_claims()) - set(cp.claims) - set(cp.unreadable)
    for uid in sorted(lost):
        log.warning(
            "CDI spec of a claim the checkpoint does not hold: kept until the kubelet "
            "unprepares the claim",
            claim_uid=uid,
        )
    store.save(cp)
    if ex.mig is not None:
        profiles = ex.profiles()
        ex.mig.restore_modes(set(profiles), profiles)
        # A claim a newer release recorded in a form this one cannot read may hold a
        # GPU whole: what was switched for it stays.
        keep = lost | set(cp.unreadable)
        ex.mig.restore_disabled(set(profiles), held_whole(cp), keep_for=keep)
    return cp


def _others(cp: Checkpoint, uid: str) -> dict[tuple[str, str], int]:
    return pod_totals(r for r in cp.claims.values() if r.uid != uid)
