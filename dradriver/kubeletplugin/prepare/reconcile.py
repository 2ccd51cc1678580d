"""What a crash or a reboot left, finished: at startup, interrupted prepares are undone
(MIG instances included), completed claims get their MIG devices, MPS daemons and CDI
specs back, and spec files no claim owns are removed; a prepared claim asked for again
gets back what a reboot took (restore), and an earlier attempt whose rollback could not
finish is released before the next (release_earlier)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from dradriver.errors import CdiError, ClaimStateError, MigError, SharingError
from dradriver.kubeletplugin.prepare.execute import Executor, layered, undo_all
from dradriver.kubeletplugin.state.checkpoint import reconcile_boot
from dradriver.kubeletplugin.state.checkpoint.store import InLock, Journal, held_whole
from dradriver.kubeletplugin.state.ledger import record_gpus
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
    owned_partitions,
)
from dradriver.logs import get_logger

if TYPE_CHECKING:
    from dradriver.kubeletplugin.prepare.preparer import Preparer

log = get_logger("kubeletplugin.reconcile")


def at_start(p: Preparer) -> bool:
    """Every GPU's lock first: the other instance's hardware work in progress is not a
    crash's leftover. True when it changed the partitions the checkpoint holds (an
    interrupted carve undone): what was discovered before, and published, must be
    discovered again."""
    local = p.devices().values()
    every = {d.gpu.uuid for d in local} | {str(d.uuid) for d in local if d.uuid}
    with p.gpus.hold(every), p.lock:
        p.store.remove_stale_temps()
        try:
            before = owned_partitions(p.load())
        except ClaimStateError:
            log.error(
                "CHECKPOINT FROM A NEWER RELEASE: not reconciling, and refusing every "
                "prepare and unprepare until it is resolved",
                error=p.refusal,
            )
            return False
        cp = reconcile(p)
        p.metrics.prepared_claims.set(len(cp.claims))
        return owned_partitions(cp) != before


def reconcile(p: Preparer) -> Checkpoint:
    """Call under the node lock, before serving. Returns the checkpoint it saved."""
    store, ex = p.store, p.executor
    boot = reconcile_boot(store.load())
    cp = boot.checkpoint
    journal = InLock(cp, store)  # each record made below: put in `cp`, saved
    for rec in boot.dropped + boot.interrupted:
        log.warning(
            "undoing an interrupted prepare", claim=rec.ref, claim_uid=rec.uid, state=rec.state
        )
        if undo_all(ex.steps(rec, journal), rec) is None:
            cp.claims.pop(rec.uid, None)
        else:
            cp.claims[rec.uid] = rec  # kept, unfinished: the next prepare or start retries

    # The completed claims, by UID: each step below reads the record as cp.claims holds it
    # now (a step before may have saved a new one) and saves the one it makes.
    completed = [uid for uid, r in cp.claims.items() if r.state == PREPARE_COMPLETED]
    if ex.mig is not None:
        try:
            carved = ex.mig.reconcile([cp.claims[u] for u in completed], ex.profiles())
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
                steps.recheck(cp.claims[uid], journal.record)
            except SharingError as exc:
                log.error("could not restart an MPS daemon", claim_uid=uid, error=str(exc))
    if ex.pod_memory is not None:
        # Set again (the same values): a limit set before a crash may not have been saved.
        for uid in completed:
            others = functools.partial(journal.pod_memory, uid)
            if (limited := ex.pod_memory.apply(cp.claims[uid], others)) is not None:
                journal.record(limited)
    if ex.imex is not None:
        # A reboot ended the IMEX daemons of the claims still prepared: started again.
        for uid in completed:
            ex.imex.ensure(cp.claims[uid], journal.record)
    local = p.devices()
    for rec in [cp.claims[uid] for uid in completed]:
        if missing := [d.device for d in rec.devices if d.device not in local and d.imex is None]:
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


def restore(ex: Executor, rec: ClaimRecord, journal: Journal) -> ClaimRecord:
    """A prepared claim asked for again: what a reboot or the kubelet's restart took
    is brought back (its CDI spec, its IMEX daemon, its pod's cgroup limits)."""
    try:
        # /var/run/cdi is wiped at reboot: a recorded result without its spec (or the
        # driver spec it names) would leave the container unable to start.
        ex.ensure_driver_spec(rec)
        if not ex.cdi_writer.exists(rec.uid):
            ex.cdi_writer.write(rec.uid, ex.spec(rec))
            log.info("CDI spec rewritten", claim=rec.ref, claim_uid=rec.uid)
    except (ValueError, CdiError) as exc:
        raise layered(exc, rec.ref) from exc
    if ex.imex is not None:
        rec = ex.imex.ensure(rec, journal.record)
    if ex.pod_memory is not None:
        # The pod's cgroup is new after the kubelet's restart or a reboot.
        others = functools.partial(journal.pod_memory, rec.uid)
        if (limited := ex.pod_memory.apply(rec, others)) is not None:
            try:
                journal.record(limited)
            except OSError as exc:  # the limit is set; its record follows at a later save
                log.warning("could not save a share's pod cgroups", error=str(exc))
    return rec


def release_earlier(p: Preparer, cp: Checkpoint, ref: ClaimRef, *, earlier: ClaimRecord) -> None:
    """An attempt whose rollback could not finish: release it before trying again,
    or its MIG device or daemon would lose its only record. Unless it is not over:
    a thread of this instance, or the other instance, is still at its hardware work
    (its GPUs' locks are held), and must not be undone under it."""
    held = None if ref.uid in p.in_flight else p.gpus.try_hold(record_gpus(earlier))
    if held is None:
        raise ClaimStateError(
            f"claim {ref} is still being prepared by an earlier call (its GPUs are "
            "busy with it); the kubelet retries",
            reason="in_flight",
        )
    with held:
        p.executor.rollback(InLock(cp, p.store), earlier)
    if ref.uid in cp.claims:
        raise ClaimStateError(
            f"claim {ref}: an earlier attempt left devices that could "
            "not be released yet; the kubelet retries",
            reason="earlier_attempt",
        )
