"""Prepare and unprepare: the node component's main job. For each claim the kubelet names,
each one independent: check the reference, answer from the checkpoint if it is prepared
already, else read the claim, plan (plan.py) and execute (execute.py), under the node
lock and the locks of the GPUs it touches. See docs/design.md, "Prepare: read, plan,
apply, record"."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dradriver.crashpoints import crashpoint
from dradriver.errors import CdiError, CheckpointError, ClaimStateError, DriverError
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
from dradriver.kubeletplugin.prepare.reconcile import reconcile
from dradriver.kubeletplugin.state.checkpoint import CheckpointStore
from dradriver.kubeletplugin.state.checkpoint.codec import check_readable, newer_file
from dradriver.kubeletplugin.state.checkpoint.store import Committed, InLock
from dradriver.kubeletplugin.state.files import NodeLock
from dradriver.kubeletplugin.state.ledger import GpuLocks, record_gpus
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
    PreparedDevice,
    owned_partitions,
)
from dradriver.logs import get_logger
from dradriver.slices.consumable import OFF, Consumable

log = get_logger("kubeletplugin.prepare")


T = TypeVar("T")


def internal_error(ref: ClaimRef, exc: Exception) -> DriverError:
    """An exception no layer turned into a DriverError, as this claim's error: the log
    has the traceback for a bug report."""
    if isinstance(exc, RecursionError):
        return DriverError(
            f"claim {ref}: the claim nests too deeply to be read; simplify its parameters",
            reason="too_deep",
        )
    text = str(exc)
    text = text if len(text) <= 300 else text[:300] + "..."
    return DriverError(
        f"claim {ref}: internal error ({type(exc).__name__}: {text}); this is a bug in "
        "dradriver, please report it with the plugin's log",
        reason="internal",
    )


def each_claim(
    op: str, refs: list[ClaimRef], one: Callable[[ClaimRef], T], *, metrics: Metrics
) -> dict[str, T | DriverError]:
    """`one(ref)` for each claim: its result, or its error."""
    seconds = metrics.prepare_seconds if op == "prepare" else metrics.unprepare_seconds
    out: dict[str, T | DriverError] = {}

    def failed(ref: ClaimRef, err: DriverError, start: float, *, trace: bool) -> None:
        out[ref.uid] = err
        seconds.labels("error").observe(time.monotonic() - start)
        metrics.errors.labels(op, err.reason).inc()
        log.error(
            f"{op} failed",
            exc=trace,  # the traceback, logged while its exception is being handled
            claim=str(ref),
            claim_uid=ref.uid,
            layer=err.layer,
            reason=err.reason,
            error=str(err),
        )

    for ref in refs:
        start = time.monotonic()
        try:
            out[ref.uid] = one(ref)
        except DriverError as exc:
            failed(ref, exc, start, trace=False)
        except Exception as exc:  # a bug or an input nobody foresaw: this claim only
            failed(ref, internal_error(ref, exc), start, trace=True)
        else:
            seconds.labels("ok").observe(time.monotonic() - start)
    return out


class UnpreparedMeanwhile:
    """Which claims were unprepared while a prepare was running (the kubelet may give up
    on a prepare stalled on the API server), so that the prepare does not prepare them
    after all; kept only for the prepares in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, float] = {}  # prepare token -> when it began (monotonic)
        self._at: dict[str, float] = {}  # claim UID -> last unprepare, oldest first
        self._tokens = itertools.count()

    def prepare_began(self) -> tuple[int, float]:
        """A prepare starts: its token (for prepare_ended) and its start time."""
        with self._lock:
            token, began = next(self._tokens), time.monotonic()
            self._running[token] = began
            return token, began

    def prepare_ended(self, token: int) -> None:
        with self._lock:
            self._running.pop(token, None)
            if not self._running:
                self._at.clear()

    def unprepared(self, uid: str) -> None:
        with self._lock:
            if not self._running:
                return  # every later prepare begins after this
            self._at.pop(uid, None)  # re-inserted last: the dict stays in time order
            self._at[uid] = time.monotonic()
            oldest = min(self._running.values())
            while self._at:
                first = next(iter(self._at))
                if self._at[first] >= oldest:
                    break
                del self._at[first]

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


@dataclass(frozen=True)
class _OnGpus:
    """An unprepare with hardware work: done under these GPUs' locks."""

    gpus: frozenset[str]


@dataclass
class Preparer:
    driver: str
    node: str
    kube: Kube | None
    store: CheckpointStore
    executor: Executor
    lock: NodeLock
    # The devices this node offers right now, by name (inventory.node_devices).
    devices: Callable[[], Mapping[str, NodeDevice]]
    metrics: Metrics
    status: StatusWriter | None = None
    # Reads a claim; the API server by default (tests hand claims in as plain values).
    read_claim: Callable[[ClaimRef], dict[str, Any]] | None = None
    # Why this plugin touches nothing (a checkpoint from a newer release); "" when it may.
    refusal: str = ""
    # Unprepares that prepares still running began before.
    meanwhile: UnpreparedMeanwhile = field(default_factory=UnpreparedMeanwhile)
    # The GPUs' locks for hardware work; <checkpoint's directory>/locks by default.
    gpu_locks: GpuLocks | None = None
    # --consumable-capacity: how a share's limits follow from its allocation.
    consumable: Consumable = OFF
    # Which GPU each device name was published for (state/name_book.py); None: no check.
    names: Callable[[], Mapping[str, GpuIdentity]] | None = None

    def _load(self) -> Checkpoint:
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
        self.gpus = self.gpu_locks or GpuLocks(self.store.path.parent / "locks")
        # Claims whose hardware work a thread of this instance is doing right now.
        self._in_flight: set[str] = set()

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
                return self._already_prepared(self._load(), ref)

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
        with self.lock:
            done, rec = self._prepare_step(self._load(), ref, claim, local=local, began=began)
        if rec is None:
            return done
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

    def _prepare_step(
        self,
        cp: Checkpoint,
        ref: ClaimRef,
        claim: dict[str, Any],
        *,
        local: Mapping[str, NodeDevice],
        began: float,
    ) -> tuple[list[PreparedDevice], ClaimRecord | None]:
        """Under the node lock: plan; apply a claim that changes no hardware; record the
        intent of any other (its hardware work follows, under its GPUs' locks)."""
        self._not_unprepared(ref, began)
        check_readable(cp, ref, "preparing")
        done = self._already_prepared(cp, ref)  # the other instance may have been faster
        if done is not None:
            return done, None
        earlier = cp.claims.get(ref.uid)
        if earlier is not None:
            self._release_earlier(cp, ref, earlier)
        rec = plan(
            claim,
            ref,
            driver=self.driver,
            node=self.node,
            devices=local,
            checkpoint=cp,
            now=time.time(),
            consumable=self.consumable,
            identities=self.names() if self.names is not None else None,
            channels=self.executor.imex is not None,
            driver_files=self.executor.driver_spec is not None,
        )
        if self.executor.changes_hardware(rec):
            self.executor.check(rec)
            self._in_flight.add(rec.uid)
            cp.claims[rec.uid] = rec  # the intent
            try:
                self.store.save(cp)
            except OSError as exc:
                self._in_flight.discard(rec.uid)
                raise CheckpointError(
                    f"claim {ref}: checkpoint layer: {exc}", reason="checkpoint"
                ) from exc
            crashpoint("intent-recorded")
            self._count(cp)
            return rec.devices, rec
        rec = self.executor.apply(InLock(cp, self.store), rec, time.time)  # undone if it fails
        self._count(cp)
        return rec.devices, rec

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

    def _release_earlier(self, cp: Checkpoint, ref: ClaimRef, earlier: ClaimRecord) -> None:
        """An attempt whose rollback could not finish: release it before trying again,
        or its MIG device or daemon would lose its only record. Unless it is not over:
        a thread of this instance, or the other instance, is still at its hardware work
        (its GPUs' locks are held), and must not be undone under it."""
        held = None if ref.uid in self._in_flight else self.gpus.try_hold(record_gpus(earlier))
        if held is None:
            raise ClaimStateError(
                f"claim {ref} is still being prepared by an earlier call (its GPUs are "
                "busy with it); the kubelet retries",
                reason="in_flight",
            )
        with held:
            self.executor.rollback(InLock(cp, self.store), earlier)
        if ref.uid in cp.claims:
            raise ClaimStateError(
                f"claim {ref}: an earlier attempt left devices that could "
                "not be released yet; the kubelet retries",
                reason="earlier_attempt",
            )

    def _prepare_on_gpus(self, ref: ClaimRef, rec: ClaimRecord, began: float) -> ClaimRecord:
        """The hardware work of a claim whose intent is durable, under its GPUs' locks;
        the node lock only for each step's checkpoint update. An unprepare of the claim
        meanwhile (it waits for these locks) stops it from completing: rolled back."""
        journal = Committed(
            self.lock,
            load=self._load,
            store=self.store,
            guard=lambda: self._not_unprepared(ref, began, "worked on its GPUs"),
            changed=self._count,
        )
        try:
            with self.gpus.hold(record_gpus(rec)):
                return self.executor.apply(journal, rec, time.time)
        finally:
            self._in_flight.discard(rec.uid)

    def _already_prepared(self, cp: Checkpoint, ref: ClaimRef) -> list[PreparedDevice] | None:
        rec = cp.claims.get(ref.uid)
        if rec is None or rec.state != PREPARE_COMPLETED:
            return None
        try:
            # /var/run/cdi is wiped at reboot: a recorded result without its spec (or the
            # driver spec it names) would leave the container unable to start.
            self.executor.ensure_driver_spec(rec)
            if not self.executor.cdi_writer.exists(ref.uid):
                self.executor.write_spec(rec)
                log.info("CDI spec rewritten", claim=str(ref), claim_uid=ref.uid)
        except ValueError as exc:
            raise CdiError(f"claim {ref}: {exc}", reason="cdi_spec") from exc
        except CdiError as exc:
            raise exc.retold(f"claim {ref}: {exc}") from exc

        journal = InLock(cp, self.store)
        if self.executor.imex is not None:
            rec = self.executor.imex.ensure(rec, journal.record)
        if (pm := self.executor.pod_memory) is not None:
            # Asked again after the kubelet's restart or a reboot: the pod's cgroup is new.
            uid = rec.uid
            limited = pm.apply(rec, lambda: journal.pod_memory(uid))
            if limited is not None:
                try:
                    journal.record(limited)
                except OSError as exc:  # the limit is set; its record follows at a later save
                    log.warning("could not save a share's pod cgroups", error=str(exc))
        return rec.devices

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
            got = self._unprepare_step(self._load(), ref)
        rec = self._unprepare_on_gpus(ref, got.gpus) if isinstance(got, _OnGpus) else got
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

    def _unprepare_step(self, cp: Checkpoint, ref: ClaimRef) -> ClaimRecord | _OnGpus | None:
        check_readable(cp, ref, "unpreparing")
        self.meanwhile.unprepared(ref.uid)
        rec = cp.claims.get(ref.uid)
        if rec is None:
            # Unknown, or already unprepared (the kubelet may repeat): success, once
            # whatever the ledger and the CDI directory still hold for it is undone;
            # hardware under the GPUs' locks, like any other claim's.
            gpus = forgotten.forgotten_gpus(self.executor, ref.uid)
            if gpus is not None:
                return _OnGpus(frozenset(gpus))
            # The ledger, just read, holds nothing for it: not read a second time.
            forgotten.remove_forgotten_spec(self.executor, ref.uid, str(ref))
            return None
        if self.executor.changes_hardware(rec):
            return _OnGpus(frozenset(record_gpus(rec)))
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
                    rec = self._load().claims.get(ref.uid)
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
                    journal = Committed(
                        self.lock, load=self._load, store=self.store, changed=self._count
                    )
                    self.executor.release(journal, rec)
                    return rec
                gpus = gpus | record_gpus(rec)  # a later attempt, on other GPUs

    # -- startup ---------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """Finishes what a crash or reboot left (see reconcile.py). Every GPU's lock
        first: the other instance's hardware work in progress is not a crash's leftover.
        True when it changed the partitions the checkpoint holds (an interrupted carve
        undone): what was discovered before, and published, must be discovered again."""
        local = self.devices().values()
        every = {d.gpu.uuid for d in local} | {str(d.uuid) for d in local if d.uuid}
        with self.gpus.hold(every), self.lock:
            self.store.remove_stale_temps()
            try:
                before = owned_partitions(self._load())
            except ClaimStateError:
                log.error(
                    "CHECKPOINT FROM A NEWER RELEASE: not reconciling, and refusing every "
                    "prepare and unprepare until it is resolved",
                    error=self.refusal,
                )
                return False
            cp = reconcile(self.store, self.executor, self.devices)
            self.metrics.prepared_claims.set(len(cp.claims))
            return owned_partitions(cp) != before
