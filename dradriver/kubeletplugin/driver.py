"""Prepare and unprepare: the node component's main job.

Each claim is independent (one bad claim fails alone) and every step that changes the
hardware is recorded before it is taken, so a crash at any point leaves a checkpoint
from which startup can finish or undo the work. Two plugin instances (rolling update)
serialize through a file lock and share the checkpoint on disk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver.api.config import ConfigError, DeviceConfig, effective
from dradriver.faults import crashpoint
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
from dradriver.kubeletplugin.claims import ClaimError, ClaimRef, Plan, check_ref, plan
from dradriver.kubeletplugin.devices import LocalDevice
from dradriver.kubeletplugin.metrics import Metrics
from dradriver.kubeletplugin.migprep import Carve, MigPreparer, intent, is_partition
from dradriver.kubeletplugin.sharing import SharingConfigError, SharingManager, plan_device
from dradriver.kubeletplugin.status import StatusWriter
from dradriver.logs import get_logger
from dradriver.nvml.mig import MigError, caps_device_minors
from dradriver.nvml.sharing import SharingError

log = get_logger("kubeletplugin.driver")
STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


@dataclass
class Wanted:
    dev: LocalDevice
    names: list[str]
    cfg: DeviceConfig | None


@dataclass
class Prepared:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


def owned_partitions(cp: Checkpoint) -> set[tuple[str, int, int]]:
    """(GPU UUID, profile ID, placement) of every partition our claims hold or intend."""
    out = set()
    for rec in cp.claims.values():
        for d in rec.devices:
            c = Carve.of(d)
            if c is not None:
                out.add((c.gpu_uuid, c.profile_id, c.placement_start))
    return out


@dataclass
class Driver:
    driver: str
    node: str
    kube: Kube | None
    store: CheckpointStore
    cdi_writer: cdi.CdiWriter
    lock: FileLock
    # The devices this node publishes right now, by name (see devices.index).
    devices: Callable[[], dict[str, LocalDevice]]
    fake: bool
    metrics: Metrics
    status: StatusWriter | None = None
    mig: MigPreparer | None = None
    sharing: SharingManager | None = None
    # Reads a claim; the API server by default (tests hand claims in as plain values).
    read_claim: Callable[[ClaimRef], dict[str, Any]] | None = None
    proc_root: Path = Path("/proc")
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
            done = self._already_prepared(self.store.load(), ref)
            if done is not None:
                return done
        p = plan(self._claim(ref), ref, self.driver, self.node)
        local = self.devices()  # one view of the node for this whole prepare
        wanted = self._wanted(ref, p, local)
        with self._locked():
            cp = self.store.load()
            done = self._already_prepared(cp, ref)  # the other instance may have been faster
            if done is not None:
                return done
            earlier = cp.claims.get(ref.uid)
            if earlier is not None:
                # An attempt whose rollback could not finish: release it before trying again,
                # or its MIG device or daemon would lose its only record.
                self._rollback(cp, earlier)
                if ref.uid in cp.claims:
                    raise ClaimError(
                        f"claim {ref}: an earlier attempt left devices that could "
                        "not be released yet; the kubelet retries"
                    )
            self._check_exclusive(cp, ref, [w.dev for w in wanted.values()], local)
            rec = ClaimRecord(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                state=STARTED,
                devices=[self._record(ref, w) for w in wanted.values()],
                updated_at=time.time(),
            )
            carving = [d for d in rec.devices if Carve.of(d) is not None]
            shared = [d for d in rec.devices if "sharing" in d.extra]
            if carving and self.mig is None:
                raise ClaimError(f"claim {ref}: MIG partitions need --mig-mode dynamic")
            if shared and self.sharing is None:
                raise ClaimError(f"claim {ref}: sharing is not available on this node")
            cp.claims[ref.uid] = rec
            if carving or shared:
                self.store.save(cp)  # intent first: a crash from here on is recoverable
                crashpoint("intent-recorded")
            try:
                for d in carving:
                    assert self.mig is not None
                    self.mig.carve(d)
                    self.store.save(cp)  # the created instance, before anything else
                    crashpoint("mig-recorded")
                if shared:
                    assert self.sharing is not None
                    self.sharing.apply(rec, lambda: self.store.save(cp))
                    crashpoint("sharing-applied")
                self.cdi_writer.write(ref.uid, self._spec(rec))
                crashpoint("cdi-written")
                rec.state = COMPLETED
                rec.updated_at = time.time()
                self.store.save(cp)
            except Exception as exc:
                self._rollback(cp, rec)
                raise ClaimError(f"claim {ref}: {_describe(exc)}") from None
            self.metrics.prepared_claims.set(len(cp.claims))
        log.info(
            "claim prepared",
            claim=str(ref),
            claim_uid=ref.uid,
            devices=",".join(d.device for d in rec.devices),
            uuids=",".join(d.uuid or "-" for d in rec.devices),
            pods=",".join(p.pods),
        )
        if self.status:
            self.status.prepared(ref, rec.devices)
        return rec.devices

    def _already_prepared(self, cp: Checkpoint, ref: ClaimRef) -> list[PreparedDevice] | None:
        rec = cp.claims.get(ref.uid)
        if rec is None or rec.state != COMPLETED:
            return None
        if not self.cdi_writer.exists(ref.uid):
            # /var/run/cdi is wiped at reboot: a recorded result without its spec would
            # leave the container unable to start.
            try:
                self.cdi_writer.write(ref.uid, self._spec(rec))
            except (ValueError, OSError) as exc:
                raise ClaimError(f"claim {ref}: {exc}") from None
            log.info("CDI spec rewritten", claim=str(ref), claim_uid=ref.uid)
        return rec.devices

    def _claim(self, ref: ClaimRef) -> dict[str, Any]:
        if self.read_claim is not None:
            return self.read_claim(ref)
        assert self.kube is not None
        try:
            return self.kube.get(
                path_for("resource.k8s.io/v1", "resourceclaims", ref.namespace, ref.name)
            )
        except NotFound:
            raise ClaimError(f"claim {ref} not found in the API server") from None
        except KubeError as exc:
            raise ClaimError(f"API layer: reading claim {ref} failed: {exc.message}") from None

    def _wanted(self, ref: ClaimRef, p: Plan, local: dict[str, LocalDevice]) -> dict[str, Wanted]:
        wanted: dict[str, Wanted] = {}
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
            w = wanted.setdefault(pd.device, Wanted(dev, [], cfg))
            if pd.request_name not in w.names:
                w.names.append(pd.request_name)
        return wanted

    def _record(self, ref: ClaimRef, w: Wanted) -> PreparedDevice:
        dev, names = w.dev, w.names
        d = PreparedDevice(
            request_names=names,
            pool=self.node,
            device=dev.name,
            cdi_device_ids=[cdi.qualified_name(self.driver, dev.name, ref.uid)],
            uuid=dev.uuid,
            kind=dev.kind,
            extra={"minor": dev.gpu.minor},
        )
        if is_partition(dev):
            intent(dev).save(d)
        elif dev.mig is not None:
            d.extra["mig"] = {
                "gpuInstanceId": dev.mig.gpu_instance_id,
                "computeInstanceId": dev.mig.compute_instance_id,
            }
        try:
            plan_device(d, w.cfg)
        except (SharingConfigError, ValueError) as exc:
            raise ClaimError(f"claim {ref}: config for request {names[0]!r}: {exc}") from None
        return d

    def _check_exclusive(
        self,
        cp: Checkpoint,
        ref: ClaimRef,
        devs: list[LocalDevice],
        local: dict[str, LocalDevice],
    ) -> None:
        for other in cp.claims.values():
            if other.uid == ref.uid:
                continue
            for od in other.devices:
                theirs = local.get(od.device)
                for dev in devs:
                    if dev.name == od.device or (theirs is not None and dev.overlaps(theirs)):
                        raise ClaimError(
                            f"claim {ref}: device {dev.name} is already prepared for claim "
                            f"{other.namespace}/{other.name} ({other.uid}); a device serves "
                            "one claim at a time"
                        )

    def _spec(self, rec: ClaimRecord) -> dict[str, Any]:
        devices = []
        for d in rec.devices:
            env, mounts = self.sharing.edits(d) if self.sharing is not None else ([], [])
            devices.append(
                cdi.CdiDevice(
                    name=d.device,
                    uuid=d.uuid or "",
                    minor=d.extra.get("minor"),
                    group=",".join(d.request_names),
                    device_nodes=tuple(self._caps_nodes(d)),
                    env=tuple(env),
                    mounts=tuple(mounts),
                )
            )
        return cdi.claim_spec(
            self.driver,
            rec.uid,
            devices,
            claim_name=f"{rec.namespace}/{rec.name}",
            fake=self.fake,
        )

    def _caps_nodes(self, d: PreparedDevice) -> list[str]:
        """A MIG device needs the /dev/nvidia-caps nodes of its GPU and compute instance."""
        if self.fake:
            return []
        c = Carve.of(d)
        ids = (c.gpu_instance_id, c.compute_instance_id) if c else None
        mig = d.extra.get("mig")
        if ids is None and isinstance(mig, dict):
            ids = (mig.get("gpuInstanceId"), mig.get("computeInstanceId"))
        if ids is None or ids[0] is None or ids[1] is None:
            return []
        gi, ci = caps_device_minors(self.proc_root, int(d.extra["minor"]), int(ids[0]), int(ids[1]))
        return [f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}"]

    def _rollback(self, cp: Checkpoint, rec: ClaimRecord) -> None:
        """Immediate rollback: everything created for this claim goes before the error
        returns. A step that cannot be undone stays recorded for startup to retry."""
        keep = False
        if self.sharing is not None:
            try:
                self.sharing.undo(rec)
            except SharingError as exc:
                keep = True
                log.error(
                    "rollback could not undo the sharing setup", claim_uid=rec.uid, error=str(exc)
                )
        for d in rec.devices:
            if Carve.of(d) is not None and self.mig is not None:
                try:
                    self.mig.uncarve(d)
                except MigError as exc:
                    keep = True
                    log.error(
                        "rollback could not destroy a MIG device",
                        claim_uid=rec.uid,
                        device=d.device,
                        error=str(exc),
                    )
        self.cdi_writer.remove(rec.uid)
        if not keep:
            cp.claims.pop(rec.uid, None)
        self._restore_mig_modes(rec)
        try:
            self.store.save(cp)
        except OSError as exc:
            log.error("rollback could not save the checkpoint", claim_uid=rec.uid, error=str(exc))

    def _restore_mig_modes(self, rec: ClaimRecord) -> None:
        if self.mig is None:
            return
        gpus = {c.gpu_uuid for d in rec.devices if (c := Carve.of(d)) is not None}
        if gpus:
            self.mig.restore_modes(gpus, self._profiles())

    def _profiles(self) -> dict[str, list[int]]:
        return {
            dev.gpu.uuid: [p.profile_id for p in dev.gpu.mig_profiles]
            for dev in self.devices().values()
            if dev.gpu.mig_profiles
        }

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
            if self.sharing is not None:
                try:
                    self.sharing.undo(rec)
                except SharingError as exc:
                    raise ClaimError(
                        f"sharing layer: claim {ref}: {exc}; the kubelet retries"
                    ) from None
            for d in rec.devices:
                if Carve.of(d) is not None and self.mig is not None:
                    try:
                        self.mig.uncarve(d)
                    except MigError as exc:
                        hint = " (a process still uses it)" if exc.in_use else ""
                        raise ClaimError(
                            f"MIG layer: claim {ref}: device {d.device}: {exc}"
                            f"{hint}; the kubelet retries"
                        ) from None
            try:
                self.cdi_writer.remove(ref.uid)
            except OSError as exc:
                raise ClaimError(
                    f"CDI layer: removing the spec of claim {ref} failed: {exc}"
                ) from None
            del cp.claims[ref.uid]
            self.store.save(cp)
            self._restore_mig_modes(rec)
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
        """Finishes what a crash or reboot left: interrupted prepares are undone (MIG
        instances included), completed claims get their devices and CDI specs back, and
        spec files nobody owns are removed."""
        with self._locked():
            boot = reconcile_boot(self.store.load())
            cp = boot.checkpoint
            undo = boot.dropped + boot.interrupted
            for rec in undo:
                log.warning(
                    "undoing an interrupted prepare",
                    claim=f"{rec.namespace}/{rec.name}",
                    claim_uid=rec.uid,
                    state=rec.state,
                )
            if self.mig is not None:
                completed = [
                    r for r in cp.claims.values() if r.state == COMPLETED and r not in undo
                ]
                try:
                    self.mig.reconcile(completed, undo, self._profiles())
                except MigError as exc:
                    log.error("MIG reconciliation incomplete", error=str(exc))
            for rec in undo:
                if self.sharing is not None:
                    try:
                        self.sharing.undo(rec)
                    except SharingError as exc:
                        log.error(
                            "could not undo an interrupted sharing setup",
                            claim_uid=rec.uid,
                            error=str(exc),
                        )
                self.cdi_writer.remove(rec.uid)
                cp.claims.pop(rec.uid, None)
            if self.sharing is not None:
                for rec in cp.claims.values():
                    try:
                        self.sharing.recheck(rec, lambda: self.store.save(cp))
                    except SharingError as exc:
                        log.error(
                            "could not restart an MPS daemon", claim_uid=rec.uid, error=str(exc)
                        )
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
                try:
                    # Always rewritten: a reboot wipes /var/run/cdi, and a partition carved
                    # again has a new MIG UUID.
                    self.cdi_writer.write(rec.uid, self._spec(rec))
                except (ValueError, OSError) as exc:
                    log.error(
                        "CDI spec could not be restored",
                        claim=f"{rec.namespace}/{rec.name}",
                        claim_uid=rec.uid,
                        error=str(exc),
                    )
            for uid in self.cdi_writer.list_claims():
                if uid not in cp.claims:
                    log.warning("removing an orphaned CDI spec", claim_uid=uid)
                    self.cdi_writer.remove(uid)
            self.store.save(cp)
            if self.mig is not None:
                self.mig.restore_modes(set(self._profiles()), self._profiles())
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


def _describe(exc: Exception) -> str:
    if isinstance(exc, MigError):
        return f"MIG layer: {exc}"
    return str(exc)


def _reason(exc: ClaimError) -> str:
    text = str(exc)
    for key, reason in (
        ("replaced", "claim_replaced"),
        ("not allocated", "not_allocated"),
        ("not reserved", "not_reserved"),
        ("not found", "not_found"),
        ("already prepared", "device_busy"),
        ("request layer", "bad_request"),
        ("MIG layer", "mig"),
        ("sharing", "sharing"),
        ("API layer", "api"),
        ("CDI layer", "cdi"),
        ("config", "config"),
    ):
        if key in text:
            return reason
    return "other"
