"""Prepare and unprepare: the node component's main job. For each claim the kubelet names,
each one independent: check the reference, answer from the checkpoint if it is prepared
already, else read the claim, plan (plan.py) and execute (execute.py), under the node
lock and the locks of the GPUs it touches. See docs/design.md, "Prepare: read, plan,
apply, record"."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dradriver.crashpoints import crashpoint
from dradriver.errors import CheckpointError, ClaimStateError, DriverError, internal_error
from dradriver.inventory.naming import GpuIdentity
from dradriver.inventory.node_devices import NodeDevice
from dradriver.k8s import Kube
from dradriver.kubeletplugin.endpoints.metrics import Metrics
from dradriver.kubeletplugin.prepare import forgotten
from dradriver.kubeletplugin.prepare.claim_devices import check_ref
from dradriver.kubeletplugin.prepare.claim_read import read_claim
from dradriver.kubeletplugin.prepare.claim_status import StatusWriter
from dradriver.kubeletplugin.prepare.execute import Executor
from dradriver.kubeletplugin.prepare.plan import plan
from dradriver.kubeletplugin.prepare.reconcile import at_start, release_earlier, restore
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.checkpoint.codec import check_readable, newer_file
from dradriver.kubeletplugin.state.checkpoint.store import Committed, InLock
from dradriver.kubeletplugin.state.files import FileLock
from dradriver.kubeletplugin.state.ledger import GpuLocks, record_gpus
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
    PreparedDevice,
)
from dradriver.logs import get_logger
from dradriver.slices.consumable import OFF, Consumable

log = get_logger("kubeletplugin.prepare")


T = TypeVar("T")


def each_claim(
    op: str, refs: list[ClaimRef], one: Callable[[ClaimRef], T], *, metrics: Metrics
) -> dict[str, T | DriverError]:
    """`one(ref)` for each claim: its result, or its error."""
    seconds = metrics.prepare_seconds if op == "prepare" else metrics.unprepare_seconds
    out: dict[str, T | DriverError] = {}
    for ref in refs:
        start = time.monotonic()
        try:
            out[ref.uid] = one(ref)
        except Exception as exc:  # a DriverError, or a bug nobody foresaw: this claim only
            err = exc if isinstance(exc, DriverError) else internal_error(str(ref), exc)
            out[ref.uid] = err
            seconds.labels("error").observe(time.monotonic() - start)
            metrics.errors.labels(op, err.reason).inc()
            log.error(
                f"{op} failed",
                # A bug's traceback, logged while its exception is being handled.
                exc=not isinstance(exc, DriverError),
                claim=str(ref),
                claim_uid=ref.uid,
                layer=err.layer,
                reason=err.reason,
                error=str(err),
            )
        else:
            seconds.labels("ok").observe(time.monotonic() - start)
    return out


class UnpreparedMeanwhile:
    """Which claims were unprepared while a prepare was running (the kubelet may give up
    on a prepare stalled on the API server), so that the prepare does not prepare them
    after all; kept only for the prepares in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[object, float] = {}  # prepare token -> when it began (monotonic)
        self._at: dict[str, float] = {}  # claim UID -> its last unprepare

    def prepare_began(self) -> tuple[object, float]:
        """A prepare starts: its token (for prepare_ended) and its start time."""
        with self._lock:  # registered as it begins: an unprepare is before it or seen
            token, began = object(), time.monotonic()
            self._running[token] = began
            return token, began

    def prepare_ended(self, token: object) -> None:
        with self._lock:
            self._running.pop(token, None)
            # Only the prepares still running can ask about an unprepare.
            oldest = min(self._running.values(), default=math.inf)
            self._at = {uid: at for uid, at in self._at.items() if at >= oldest}

    def unprepared(self, uid: str) -> None:
        with self._lock:
            if self._running:  # else every later prepare begins after this
                self._at[uid] = time.monotonic()

    def since(self, uid: str, began: float) -> bool:
        """Whether `uid` was unprepared at or after `began`."""
        with self._lock:
            return self._at.get(uid, float("-inf")) >= began

    def __len__(self) -> int:
        with self._lock:
            return len(self._at)


@dataclass
class Prepared:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass
class Preparer:
    driver: str
    node: str
    kube: Kube | None
    store: CheckpointStore
    executor: Executor
    lock: FileLock
    # The devices this node offers right now, by name (inventory.node_devices).
    devices: Callable[[], Mapping[str, NodeDevice]]
    metrics: Metrics
    status: StatusWriter | None = None
    # Reads a claim; the API server by default (tests hand claims in as plain values).
    read_claim: Callable[[ClaimRef], dict[str, Any]] | None = None
    # Why this plugin touches nothing (a checkpoint from a newer release); "" when it may.
    refusal: str = ""
    # --consumable-capacity: how a share's limits follow from its allocation.
    consumable: Consumable = OFF
    # Which GPU each device name was published for (state/name_book.py); None: no check.
    name_book: Callable[[], Mapping[str, GpuIdentity]] | None = None

    def load(self) -> Checkpoint:
        """The checkpoint, unless a newer release wrote it in a form this release cannot
        read (codec.py's minReader): then every call is refused, and nothing it records
        is undone, redone or rewritten by this older release."""
        cp = self.store.load()
        if not cp.readable:
            self.refusal = newer_file(str(self.store.path), cp)
            raise ClaimStateError(self.refusal, reason="newer_checkpoint")
        self.refusal = ""
        return cp

    # -- prepare ---------------------------------------------------------------------------
    def prepare(self, refs: list[ClaimRef]) -> dict[str, Prepared]:
        got = each_claim("prepare", refs, self._prepare_one, metrics=self.metrics)
        return {
            uid: Prepared(error=str(r)) if isinstance(r, DriverError) else Prepared(devices=r)
            for uid, r in got.items()
        }

    def __post_init__(self) -> None:
        # Unprepares that prepares still running began before.
        self.meanwhile = UnpreparedMeanwhile()
        # The GPUs' locks for hardware work, beside the checkpoint.
        self.gpus = GpuLocks(self.store.path.parent / "locks")
        # Claims whose hardware work a thread of this instance is doing right now.
        self.in_flight: set[str] = set()

    def _count(self, cp: Checkpoint) -> None:
        self.metrics.prepared_claims.set(len(cp.claims))

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        check_ref(ref)
        token, began = self.meanwhile.prepare_began()
        try:
            return self._prepare_began(ref, began)
        finally:
            self.meanwhile.prepare_ended(token)

    def _prepare_began(self, ref: ClaimRef, began: float) -> list[PreparedDevice]:
        # A claim already prepared answers from the checkpoint, without the API server.
        # The look under the node lock is skipped when this process's last view of the
        # checkpoint has no record of the claim (a new claim: nearly every call); the
        # step after the GET looks again under the lock, the other instance's records too.
        def look() -> list[PreparedDevice] | None:
            with self.lock:
                return self._already_prepared(self.load(), ref)

        cached = self.store.cached
        looked = cached is None or bool(self.refusal) or ref.uid in cached.claims
        if looked and (done := look()) is not None:
            return done
        try:
            claim = self._claim(ref)
        except Exception:
            # The API server unreachable, or the claim gone: one the other instance
            # prepared meanwhile still answers from the checkpoint.
            if looked or (done := look()) is None:
                raise
            return done
        local = self.devices()  # one view of the node for this whole prepare
        # Under the node lock: plan; apply a claim that changes no hardware; record the
        # intent of any other (its hardware work follows, under its GPUs' locks).
        with self.lock:
            cp = self.load()
            self._not_unprepared(ref, began)
            check_readable(cp, ref, "preparing")
            # The other instance may have been faster.
            if (done := self._already_prepared(cp, ref)) is not None:
                return done
            if (earlier := cp.claims.get(ref.uid)) is not None:
                release_earlier(self, cp, ref, earlier=earlier)
            rec = plan(
                claim,
                ref,
                driver=self.driver,
                node=self.node,
                devices=local,
                checkpoint=cp,
                now=time.time(),
                consumable=self.consumable,
                name_book=self.name_book() if self.name_book is not None else None,
                channels=self.executor.imex is not None,
                driver_files=self.executor.driver_spec is not None,
            )
            if not self.executor.changes_hardware(rec):
                # Undone if it fails.
                rec = self.executor.apply(InLock(cp, self.store), rec, time.time)
            else:
                self.executor.check(rec)
                cp.claims[rec.uid] = rec  # the intent
                try:
                    self.store.save(cp)
                except OSError as exc:
                    raise CheckpointError(
                        f"claim {ref}: checkpoint layer: {exc}", reason="checkpoint"
                    ) from exc
                self.in_flight.add(rec.uid)  # before the node lock is let go
                crashpoint("intent-recorded")
            self._count(cp)
        if rec.state != PREPARE_COMPLETED:
            rec = self._prepare_on_gpus(ref, rec, began)
        log.info(
            "claim prepared",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=",".join(d.device for d in rec.devices),
            uuids=",".join(d.uuid or "-" for d in rec.devices),
            pods=",".join(r.get("name", "") for r in claim["status"].get("reservedFor") or []),
        )
        if self.status:
            self.status.prepared(ref, rec.devices)
        return rec.devices

    def _not_unprepared(
        self, ref: ClaimRef, began: float, during: str = "waited for the API server"
    ) -> None:
        if self.meanwhile.since(ref.uid, began):
            # The kubelet gave up on this prepare and unprepared the claim while it
            # waited (for the API server, or for its GPUs): preparing now would leave
            # devices nobody releases.
            raise ClaimStateError(
                f"claim {ref} was unprepared while this prepare {during}; not preparing "
                "it (the kubelet asks again if it still wants it)",
                reason="unprepared_meanwhile",
            )

    def _prepare_on_gpus(self, ref: ClaimRef, rec: ClaimRecord, began: float) -> ClaimRecord:
        """The hardware work of a claim whose intent is durable, under its GPUs' locks;
        the node lock only for each step's checkpoint update. An unprepare of the claim
        meanwhile (it waits for these locks) stops it from completing: rolled back."""
        journal = self._committed(lambda: self._not_unprepared(ref, began, "worked on its GPUs"))
        try:
            with self.gpus.hold(record_gpus(rec)):
                return self.executor.apply(journal, rec, time.time)
        finally:
            self.in_flight.discard(rec.uid)

    def _committed(self, guard: Callable[[], None] = lambda: None) -> Committed:
        """The journal of hardware work under the GPUs' locks: the node lock for each save."""
        return Committed(
            self.lock, load=self.load, store=self.store, guard=guard, changed=self._count
        )

    def _already_prepared(self, cp: Checkpoint, ref: ClaimRef) -> list[PreparedDevice] | None:
        rec = cp.claims.get(ref.uid)
        if rec is None or rec.state != PREPARE_COMPLETED:
            return None
        return restore(self.executor, rec, InLock(cp, self.store)).devices

    def _claim(self, ref: ClaimRef) -> dict[str, Any]:
        if self.read_claim is not None:
            return self.read_claim(ref)
        assert self.kube is not None
        return read_claim(self.kube, ref)

    # -- unprepare -------------------------------------------------------------------------
    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        got = each_claim("unprepare", refs, self._unprepare_one, metrics=self.metrics)
        return {uid: str(r) if isinstance(r, DriverError) else "" for uid, r in got.items()}

    def _unprepare_one(self, ref: ClaimRef) -> None:
        check_ref(ref)
        with self.lock:
            got = self._unprepare_step(self.load(), ref)
        rec = self._unprepare_on_gpus(ref, got) if isinstance(got, frozenset) else got
        if rec is None:
            return
        log.info(
            "claim unprepared",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=",".join(d.device for d in rec.devices),
        )
        if self.status:
            self.status.unprepared(ref)

    def _unprepare_step(self, cp: Checkpoint, ref: ClaimRef) -> ClaimRecord | frozenset[str] | None:
        """The claim's record released under the node lock; or the GPUs under whose locks
        its release must be done (hardware work); or None, nothing recorded."""
        check_readable(cp, ref, "unpreparing")
        self.meanwhile.unprepared(ref.uid)
        if (rec := cp.claims.get(ref.uid)) is None:
            # Unknown, or already unprepared (the kubelet may repeat): success, once
            # whatever the ledger and the CDI directory still hold for it is undone;
            # hardware under the GPUs' locks, like any other claim's.
            if (gpus := forgotten.forgotten_gpus(self.executor, ref.uid)) is not None:
                return frozenset(gpus)
            # The ledger, just read, holds nothing for it: not read a second time.
            forgotten.remove_forgotten_spec(self.executor, ref.uid, str(ref))
            return None
        if self.executor.changes_hardware(rec):
            return frozenset(record_gpus(rec))
        # A failed save leaves it recorded on disk: the kubelet's retry releases it again.
        self.executor.release(InLock(cp, self.store), rec)
        self._count(cp)
        return rec

    def _unprepare_on_gpus(self, ref: ClaimRef, gpus: frozenset[str]) -> ClaimRecord | None:
        """Under the claim's GPUs' locks: a prepare of it still at work finishes first
        (or, as this unprepare came meanwhile, rolls back), then the record is read again
        and released."""
        while True:
            with self.gpus.hold(gpus):
                with self.lock:
                    rec = self.load().claims.get(ref.uid)
                if rec is None:
                    # Its prepare rolled back, another call released it, or its record
                    # was lost: what the ledger still holds for it is undone.
                    more = forgotten.forgotten_gpus(self.executor, ref.uid) or set()
                    if more <= gpus:
                        forgotten.release_forgotten(self.executor, ref.uid, str(ref))
                        return None
                    gpus = gpus | more
                    continue
                if record_gpus(rec) <= gpus:
                    self.executor.release(self._committed(), rec)
                    return rec
                gpus = gpus | record_gpus(rec)  # a later attempt, on other GPUs

    # -- startup ---------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """Finishes what a crash or reboot left (reconcile.py's at_start)."""
        return at_start(self)
