"""Prepare and unprepare: the node component's main job.

Each claim is independent (one bad claim fails alone) and every step is recorded before
it is taken, so a crash at any point leaves a checkpoint from which startup can finish or
undo the work. Two plugin instances (rolling update) serialize through a file lock and
share the checkpoint on disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dradriver.api.config import ConfigError, effective
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.kubeletplugin import cdi
from dradriver.kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    FileLock,
    PreparedDevice,
    reconcile_boot,
)
from dradriver.kubeletplugin.claims import ClaimError, ClaimRef, check_ref, plan
from dradriver.kubeletplugin.devices import LocalDevice
from dradriver.kubeletplugin.metrics import Metrics
from dradriver.kubeletplugin.status import StatusWriter
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.driver")
STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


@dataclass
class Prepared:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass
class Driver:
    driver: str
    node: str
    kube: Kube
    store: CheckpointStore
    cdi_writer: cdi.CdiWriter
    lock: FileLock
    # The devices this node publishes right now, by name (see devices.index).
    devices: Callable[[], dict[str, LocalDevice]]
    fake: bool
    metrics: Metrics
    status: StatusWriter | None = None
    _mutex: threading.Lock = field(default_factory=threading.Lock)

    # -- prepare ---------------------------------------------------------------------------
    def prepare(self, refs: list[ClaimRef]) -> dict[str, Prepared]:
        out: dict[str, Prepared] = {}
        for ref in refs:
            start = time.monotonic()
            try:
                out[ref.uid] = Prepared(devices=self._prepare_one(ref))
                self.metrics.prepare_seconds.labels("ok").observe(time.monotonic() - start)
            except ClaimError as exc:
                out[ref.uid] = Prepared(error=str(exc))
                self.metrics.prepare_seconds.labels("error").observe(time.monotonic() - start)
                self.metrics.errors.labels("prepare", _reason(exc)).inc()
                log.error("prepare failed", claim=str(ref), claim_uid=ref.uid, error=str(exc))
        return out

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        check_ref(ref)
        # A claim already prepared answers from the checkpoint, without the API server.
        with self._locked():
            cp = self.store.load()
            rec = cp.claims.get(ref.uid)
            if rec is not None and rec.state == COMPLETED:
                if not self.cdi_writer.exists(ref.uid):
                    # /var/run/cdi is wiped at reboot: a recorded result without its spec
                    # would leave the container unable to start.
                    try:
                        self.cdi_writer.write(ref.uid, self._spec(rec))
                    except (ValueError, OSError) as exc:
                        raise ClaimError(f"claim {ref}: {exc}") from None
                    log.info("CDI spec rewritten", claim=str(ref), claim_uid=ref.uid)
                return rec.devices
        claim = self._get_claim(ref)
        p = plan(claim, ref, self.driver, self.node)
        local = self.devices()
        wanted: dict[str, tuple[LocalDevice, list[str]]] = {}
        for pd in p.devices:
            dev = local.get(pd.device)
            if dev is None:
                raise ClaimError(
                    f"claim {ref}: device {pd.device} is not published by this "
                    "node (any more); the claim must be allocated again"
                )
            try:
                cfg = effective(list(pd.configs), dev.kind, pd.request_name)
            except ConfigError as exc:
                raise ClaimError(f"claim {ref}: {exc}") from None
            if cfg is not None and cfg.sharing is not None:
                raise ClaimError(
                    f"claim {ref}: sharing strategy {cfg.sharing.strategy} for "
                    f"device {pd.device} is not supported by this release yet"
                )
            names = wanted.setdefault(pd.device, (dev, []))[1]
            if pd.request_name not in names:
                names.append(pd.request_name)
        with self._locked():
            cp = self.store.load()
            rec = cp.claims.get(ref.uid)
            if rec is not None and rec.state == COMPLETED:  # the other instance was faster
                return rec.devices
            self._check_exclusive(cp, ref, [d for d, _ in wanted.values()], local)
            rec = ClaimRecord(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                state=STARTED,
                devices=[
                    PreparedDevice(
                        request_names=names,
                        pool=self.node,
                        device=dev.name,
                        cdi_device_ids=[cdi.qualified_name(self.driver, dev.name, ref.uid)],
                        uuid=dev.uuid,
                        kind=dev.kind,
                        extra={"minor": dev.gpu.minor},
                    )
                    for dev, names in wanted.values()
                ],
                updated_at=time.time(),
            )
            cp.claims[ref.uid] = rec
            self.store.save(cp)
            try:
                self.cdi_writer.write(ref.uid, self._spec(rec))
                rec.state = COMPLETED
                rec.updated_at = time.time()
                self.store.save(cp)
            except Exception as exc:
                self._rollback(cp, rec)
                raise ClaimError(f"claim {ref}: {exc}") from None
            self.metrics.prepared_claims.set(len(cp.claims))
        log.info(
            "claim prepared",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=",".join(d.device for d in rec.devices),
            pods=",".join(p.pods),
        )
        if self.status:
            self.status.prepared(ref, rec.devices)
        return rec.devices

    def _get_claim(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            return self.kube.get(
                path_for("resource.k8s.io/v1", "resourceclaims", ref.namespace, ref.name)
            )
        except NotFound:
            raise ClaimError(f"claim {ref} not found in the API server") from None
        except KubeError as exc:
            raise ClaimError(f"API layer: reading claim {ref} failed: {exc.message}") from None

    def _check_exclusive(
        self, cp: Checkpoint, ref: ClaimRef, devs: list[LocalDevice], local: dict[str, LocalDevice]
    ) -> None:
        for other in cp.claims.values():
            if other.uid == ref.uid:
                continue
            for od in other.devices:
                theirs = local.get(od.device)
                for dev in devs:
                    clash = dev.name == od.device or (theirs is not None and dev.overlaps(theirs))
                    if clash:
                        raise ClaimError(
                            f"claim {ref}: device {dev.name} is already prepared for claim "
                            f"{other.namespace}/{other.name} ({other.uid}); a device serves "
                            "one claim at a time"
                        )

    def _spec(self, rec: ClaimRecord) -> dict[str, Any]:
        return cdi.claim_spec(
            self.driver,
            rec.uid,
            [
                cdi.CdiDevice(
                    name=d.device,
                    uuid=d.uuid or "",
                    minor=d.extra.get("minor"),
                    group=",".join(d.request_names),
                )
                for d in rec.devices
            ],
            claim_name=f"{rec.namespace}/{rec.name}",
            fake=self.fake,
        )

    def _rollback(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        self.cdi_writer.remove(rec.uid)
        cp.claims.pop(rec.uid, None)
        try:
            self.store.save(cp)
        except OSError as exc:
            log.error("rollback could not save the checkpoint", claim_uid=rec.uid, error=str(exc))

    # -- unprepare -------------------------------------------------------------------------
    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in refs:
            start = time.monotonic()
            try:
                self._unprepare_one(ref)
                out[ref.uid] = ""
                self.metrics.unprepare_seconds.labels("ok").observe(time.monotonic() - start)
            except ClaimError as exc:
                out[ref.uid] = str(exc)
                self.metrics.unprepare_seconds.labels("error").observe(time.monotonic() - start)
                self.metrics.errors.labels("unprepare", _reason(exc)).inc()
                log.error("unprepare failed", claim=str(ref), claim_uid=ref.uid, error=str(exc))
        return out

    def _unprepare_one(self, ref: ClaimRef) -> None:
        check_ref(ref)
        with self._locked():
            cp = self.store.load()
            rec = cp.claims.get(ref.uid)
            if rec is None:
                return  # unknown (or already unprepared): success, the kubelet may repeat
            try:
                self.cdi_writer.remove(ref.uid)
            except OSError as exc:
                raise ClaimError(
                    f"CDI layer: removing the spec of claim {ref} failed: {exc}"
                ) from None
            del cp.claims[ref.uid]
            self.store.save(cp)
            self.metrics.prepared_claims.set(len(cp.claims))
        log.info(
            "claim unprepared",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=",".join(d.device for d in rec.devices),
        )
        if self.status:
            self.status.unprepared(ref)

    # -- startup ---------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Finishes what a crash or reboot left: interrupted prepares are undone, completed
        claims get their CDI specs back, and spec files nobody owns are removed."""
        with self._locked():
            cp = self.store.load()
            boot = reconcile_boot(cp)
            for rec in boot.dropped + boot.interrupted:
                log.warning(
                    "undoing an interrupted prepare",
                    claim=f"{rec.namespace}/{rec.name}",
                    claim_uid=rec.uid,
                    state=rec.state,
                )
                self.cdi_writer.remove(rec.uid)
                cp.claims.pop(rec.uid, None)
            local = self.devices()
            for rec in cp.claims.values():
                missing = [d.device for d in rec.devices if d.device not in local]
                if missing:
                    log.error(
                        "prepared claim refers to devices this node no longer has",
                        claim=f"{rec.namespace}/{rec.name}",
                        claim_uid=rec.uid,
                        devices=",".join(missing),
                    )
                if not self.cdi_writer.exists(rec.uid):
                    try:
                        self.cdi_writer.write(rec.uid, self._spec(rec))
                    except (ValueError, OSError) as exc:
                        # One bad record must not stop the plugin from serving the rest;
                        # the next prepare of this claim reports the problem to the pod.
                        log.error(
                            "CDI spec could not be restored",
                            claim=f"{rec.namespace}/{rec.name}",
                            claim_uid=rec.uid,
                            error=str(exc),
                        )
                        continue
                    log.info(
                        "CDI spec restored", claim=f"{rec.namespace}/{rec.name}", claim_uid=rec.uid
                    )
            for uid in self.cdi_writer.list_claims():
                if uid not in cp.claims:
                    log.warning("removing an orphaned CDI spec", claim_uid=uid)
                    self.cdi_writer.remove(uid)
            self.store.save(cp)
            self.metrics.prepared_claims.set(len(cp.claims))

    def _locked(self) -> Any:
        return _Both(self._mutex, self.lock)


class _Both:
    """The in-process mutex first (threads of this instance), then the file lock (the
    other instance during a rolling update)."""

    def __init__(self, mutex: threading.Lock, lock: FileLock) -> None:
        self.mutex, self.lock = mutex, lock

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self.lock.__enter__()
        except BaseException:
            self.mutex.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.lock.__exit__(*exc)
        finally:
            self.mutex.release()


def _reason(exc: ClaimError) -> str:
    text = str(exc)
    for key, reason in (
        ("replaced", "claim_replaced"),
        ("not allocated", "not_allocated"),
        ("not reserved", "not_reserved"),
        ("not found", "not_found"),
        ("already prepared", "device_busy"),
        ("request layer", "bad_request"),
        ("API layer", "api"),
        ("CDI layer", "cdi"),
        ("config", "config"),
    ):
        if key in text:
            return reason
    return "other"
