"""The prepare executor: applies a claim's record (made by plan.py) step by step, each
hardware change saved in the record before or right after it is taken (the crash points
below are where tests kill the process), and releases it at unprepare; a failed prepare
is rolled back at once. See docs/design.md, "Prepare: read, plan, apply, record".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.crashpoints import crashpoint
from dradriver.errors import (
    CdiError,
    CheckpointError,
    DriverError,
    ImexError,
    MigError,
    SharingError,
)
from dradriver.kubeletplugin.hardware.imex import ImexSteps
from dradriver.kubeletplugin.hardware.mig import MigPreparer
from dradriver.kubeletplugin.hardware.pod_memory import PodMemory
from dradriver.kubeletplugin.hardware.shares import ShareSteps, share_edits, share_indices
from dradriver.kubeletplugin.hardware.sharing import Save, SharingSteps, container_edits
from dradriver.kubeletplugin.prepare import cdi
from dradriver.kubeletplugin.prepare.channels import channel_cdi_device
from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec
from dradriver.kubeletplugin.state.checkpoint.store import Journal
from dradriver.kubeletplugin.state.records import PREPARE_COMPLETED, PREPARE_STARTED, ClaimRecord
from dradriver.logs import get_logger
from dradriver.nvml.host import GpuHost

log = get_logger("kubeletplugin.execute")


@dataclass
class Executor:
    driver: str
    cdi_writer: cdi.CdiWriter
    host: GpuHost
    # GPU UUID -> its MIG profile IDs, for finding instances when restoring MIG modes.
    profiles: Callable[[], dict[str, list[int]]]
    mig: MigPreparer | None = None
    # Time-slicing and MPS (a claim's GpuConfig sharing).
    sharing: SharingSteps | None = None
    # Shares of a device (consumable capacity) under its MPS daemon.
    shares: ShareSteps | None = None
    # Shares' memory as their pods' cgroup limits (r615+, whole GPUs); None: not here.
    pod_memory: PodMemory | None = None
    # ComputeDomains' IMEX channels and daemons; None: this node publishes no channels.
    imex: ImexSteps | None = None
    # The node's driver spec that GPU devices name (--driver-files cdi); None: the node's
    # runtime brings the driver (--driver-files runtime).
    driver_spec: DriverSpec | None = None

    # -- prepare ---------------------------------------------------------------------------
    def check(self, rec: ClaimRecord) -> None:
        """What this node cannot do for the claim at all, before anything is recorded."""
        if any(d.carve is not None for d in rec.devices) and self.mig is None:
            raise MigError(f"claim {rec.ref}: MIG partitions need --mig-mode dynamic")
        if any(d.sharing is not None for d in rec.devices) and self.sharing is None:
            raise SharingError(f"claim {rec.ref}: sharing is not available on this node")
        if _has_shares(rec) and self.shares is None:
            raise SharingError(f"claim {rec.ref}: shares are not available on this node")
        if any(d.imex is not None for d in rec.devices) and self.imex is None:
            raise ImexError(
                f"claim {rec.ref}: IMEX channels are not prepared on this node (the plugin "
                "runs with --imex-channels off)"
            )

    def changes_hardware(self, rec: ClaimRecord) -> bool:
        """The one test of a claim's path. True: its prepare and unprepare change the
        hardware or start a daemon (a MIG instance or mode, a sharing setup, a share, an
        IMEX daemon), so they run under its GPUs' locks, the prepare's record saved first
        as its intent. False: a CDI spec and a record, under the node lock, one save."""
        return self.mig is not None or any(
            d.carve or d.sharing or d.imex or (d.share and not d.admin_access) for d in rec.devices
        )

    def apply(self, journal: Journal, rec: ClaimRecord, now: Callable[[], float]) -> ClaimRecord:
        """Applies `rec` (in state PrepareStarted; recorded already where it changes the
        hardware) and returns it completed, recording each step in `journal`. On failure
        everything it did is undone and the error (a DriverError) names the layer."""
        self.check(rec)
        latest = rec  # as it last stood (recorded, or returned by a step): what a rollback undoes

        def seen(r: ClaimRecord) -> None:
            nonlocal latest
            latest = r

        def record(r: ClaimRecord) -> None:
            seen(r)
            journal.record(r)

        steps = self.steps(rec, journal, record)
        try:
            rec = apply_all(steps, rec, seen)
            done = dataclasses.replace(rec, state=PREPARE_COMPLETED, updated_at=now())
            record(done)
            return done
        except Exception as exc:
            self.rollback(journal, latest, steps)
            raise layered(exc, rec.ref) from exc

    def steps(self, rec: ClaimRecord, journal: Journal, save: Save | None = None) -> list[Step]:
        """The claim's hardware work in the order it is applied, each step recording (in
        `journal`, or through `save`) what the next one needs durable first: only what
        the claim uses (a whole GPU on a node without dynamic MIG: its CDI spec alone)."""
        save = save or journal.record
        out: list[Step] = []
        if (mig := self.mig) is not None:
            for i, d in enumerate(rec.devices):
                if d.carve is not None:
                    undo = functools.partial(_uncarve, mig, i)
                    carve = functools.partial(_carve, mig, i, save=save)
                    out.append(Step("MIG", f"MIG device {d.device}", undo, carve, "mig-recorded"))
            # Undone by restore_mig_modes, once the claim is forgotten.
            whole = functools.partial(self._whole, mig)
            out.append(Step("MIG", "whole GPUs out of MIG mode", lambda r: None, whole))
        if (sharing := self.sharing) is not None and any(d.sharing for d in rec.devices):
            apply = functools.partial(sharing.apply, save=save)
            what = "time-slicing and MPS setup"
            out.append(Step("sharing", what, sharing.undo, apply, "sharing-applied"))
        if (shares := self.shares) is not None and _has_shares(rec):
            apply = functools.partial(self._shares, shares, save=save, journal=journal)
            what = "shares under their devices' MPS daemons"
            out.append(Step("shares", what, shares.undo, apply))
        if (imex := self.imex) is not None and any(d.imex for d in rec.devices):
            apply = functools.partial(imex.apply, save=save)
            out.append(Step("IMEX", "IMEX daemons", imex.undo, apply, "imex-started"))
        what = "removing the CDI spec"
        out.append(Step("CDI", what, self._remove_spec, self._write_spec, "cdi-written"))
        return out

    def _whole(self, mig: MigPreparer, rec: ClaimRecord) -> ClaimRecord:
        profiles = self.profiles()
        for d in rec.devices:
            # MIG-capable GPUs only; adminAccess never switches anything.
            if d.kind == "gpu" and d.uuid in profiles and not d.admin_access:
                mig.ensure_whole(str(d.uuid), profiles[str(d.uuid)], d.device, claim=rec.uid)
        return rec

    def _shares(
        self, shares: ShareSteps, rec: ClaimRecord, *, save: Save, journal: Journal
    ) -> ClaimRecord:
        for i in share_indices(rec):
            rec = shares.join(rec, i, save)
        crashpoint("sharing-applied")
        if self.pod_memory is not None:
            limited = self.pod_memory.apply(rec, functools.partial(journal.pod_memory, rec.uid))
            if limited is not None:
                rec = limited
                save(rec)
        return rec

    def _write_spec(self, rec: ClaimRecord) -> ClaimRecord:
        """The claim's CDI spec, after the driver spec its devices name."""
        self.ensure_driver_spec(rec)
        self.cdi_writer.write(rec.uid, self.spec(rec))
        return rec

    def _remove_spec(self, rec: ClaimRecord) -> None:
        self.cdi_writer.remove(rec.uid)

    def ensure_driver_spec(self, rec: ClaimRecord) -> None:
        named = cdi.driver_device_id(self.driver)
        if self.driver_spec is not None and any(named in d.cdi_device_ids for d in rec.devices):
            self.driver_spec.ensure()

    def spec(self, rec: ClaimRecord) -> dict[str, Any]:
        """The claim's CDI spec, from its record and the node's device nodes."""
        host = self.host
        devices = []
        for d in rec.devices:
            env: list[str] = []
            mounts: list[tuple[str, str, str]] = []
            # What a device of a sharing setup or a share adds; a device held whole, nothing.
            if d.sharing is not None:
                env, mounts = container_edits(d)
            if d.share is not None:
                more_env, more_mounts = share_edits(d)
                env += more_env
                mounts += more_mounts
            if d.imex is not None:
                devices.append(channel_cdi_device(d, host.imex_channel_node(d.imex.channel)))
                continue
            nodes = host.device_nodes(d.minor, d.mig_ids())
            devices.append(
                cdi.CdiDevice(
                    name=d.cdi_name,
                    device=d.device,
                    uuid=d.uuid or "",
                    device_nodes=tuple(nodes),
                    group=",".join(d.request_names),
                    env=tuple(env),
                    mounts=tuple(mounts),
                )
            )
        return cdi.claim_spec(
            self.driver,
            rec.uid,
            devices,
            claim_name=rec.ref,
            control_nodes=host.control_device_nodes(),
        )

    def rollback(self, journal: Journal, rec: ClaimRecord, steps: list[Step] | None = None) -> None:
        """Immediate rollback: everything created for this claim goes before the error
        returns. What cannot be undone stays recorded for the retry or startup, as
        unfinished (the failure may have come after the record was marked completed)."""
        rec = dataclasses.replace(rec, state=PREPARE_STARTED)
        failed = undo_all(steps or self.steps(rec, journal), rec)
        try:
            if failed is not None:
                journal.record(rec)
            else:
                journal.forget(rec)
        except (OSError, DriverError) as exc:
            log.error("rollback could not save the checkpoint", claim_uid=rec.uid, error=str(exc))
        self.restore_mig_modes(rec, journal)

    # -- unprepare -------------------------------------------------------------------------
    def release(self, journal: Journal, rec: ClaimRecord) -> None:
        """Undoes a prepared (or half-prepared) claim and forgets it. A step that fails
        raises a DriverError and leaves the record, so the kubelet's retry finishes it."""
        failed = undo_all(self.steps(rec, journal), rec)
        if failed is not None:
            raise failed
        try:
            journal.forget(rec)
        except (OSError, DriverError) as exc:
            raise CheckpointError(
                f"checkpoint layer: claim {rec.ref}: {exc}; the kubelet retries",
                reason="checkpoint",
            ) from exc
        self.restore_mig_modes(rec, journal)

    def restore_mig_modes(self, rec: ClaimRecord, journal: Journal) -> None:
        """Switch back what this claim made us switch: MIG mode off where its partitions
        were the last, on where it held the GPU whole (and no other claim does)."""
        if self.mig is None:
            return
        gpus = {d.carve.gpu_uuid for d in rec.devices if d.carve is not None}
        if gpus:
            self.mig.restore_modes(gpus, self.profiles())
        whole = {d.uuid for d in rec.devices if d.kind == "gpu" and d.uuid}
        if whole:
            self.mig.restore_disabled(whole, journal.held_whole(rec.uid))


def _has_shares(rec: ClaimRecord) -> bool:
    """A share (consumable capacity) among the claim's devices, under its device's MPS
    daemon (an adminAccess one runs under nothing)."""
    return any(d.share is not None and not d.admin_access for d in rec.devices)


def _carve(mig: MigPreparer, i: int, rec: ClaimRecord, *, save: Save) -> ClaimRecord:
    rec = rec.with_device(i, mig.carve(rec.devices[i], rec.uid))
    save(rec)  # the created instance, before anything else
    return rec


def _uncarve(mig: MigPreparer, i: int, rec: ClaimRecord) -> None:
    mig.uncarve(rec.devices[i], rec.uid)


# How a layer's failure is prefixed in the claim's error (the CDI and checkpoint
# layers' own errors say it already).
LAYERS = {"MIG": "MIG layer: ", "sharing": "sharing layer: ", "IMEX": "IMEX layer: "}


def unchanged(rec: ClaimRecord) -> ClaimRecord:
    """A step with nothing to apply."""
    return rec


def ignoring(undo: Callable[[], object]) -> Callable[[ClaimRecord], object]:
    """An undo that finds what it undoes in a ledger, not in the record."""
    return lambda rec: undo()


@dataclass(frozen=True)
class Step:
    layer: str  # what an error names: "MIG", "sharing", "shares", "IMEX", "CDI"
    what: str  # for the log: "destroy MIG device gpu-0-mig-1g10gb-0"
    undo: Callable[[ClaimRecord], object]
    apply: Callable[[ClaimRecord], ClaimRecord] = unchanged
    crash: str = ""  # the crash point right after its apply, where tests kill the process


def layered(exc: Exception, claim: str) -> DriverError:
    """A step's failure as the per-claim error the kubelet shows, naming the layer."""
    if isinstance(exc, DriverError):
        return exc.retold(f"claim {claim}: {LAYERS.get(exc.layer, '')}{exc}")
    if isinstance(exc, OSError):
        return CheckpointError(f"claim {claim}: checkpoint layer: {exc}", reason="checkpoint")
    if isinstance(exc, ValueError):
        return CdiError(f"claim {claim}: {exc}", reason="cdi_spec")
    return DriverError(f"claim {claim}: {type(exc).__name__}: {exc}", reason="other")


def apply_all(
    steps: Sequence[Step], rec: ClaimRecord, progress: Callable[[ClaimRecord], None]
) -> ClaimRecord:
    """Each step's apply, in order, each on the record the one before left, which
    `progress` hears of; the first failure is raised as it came."""
    for step in steps:
        rec = step.apply(rec)
        if step.crash:
            crashpoint(step.crash)
        progress(rec)
    return rec


def undo_all(steps: Sequence[Step], rec: ClaimRecord) -> DriverError | None:
    """Every step's undo on `rec`, the last applied first (see the module's policy).
    Returns the first failure as the claim's error, or None when all is undone."""
    first: DriverError | None = None
    for step in reversed(steps):
        try:
            step.undo(rec)
        except (DriverError, OSError, ValueError) as exc:
            log.error(
                "could not undo a step",
                claim=rec.ref,
                claim_uid=rec.uid,
                step=step.what,
                layer=step.layer,
                error=str(exc),
            )
            first = first or _undo_failed(step, exc, rec.ref)
    return first


def _undo_failed(step: Step, exc: Exception, claim: str) -> DriverError:
    if isinstance(exc, DriverError):
        hint = " (a process still uses it)" if getattr(exc, "in_use", False) else ""
        prefix = LAYERS.get(exc.layer, "")
        return exc.retold(f"claim {claim}: {prefix}{step.what}: {exc}{hint}; the kubelet retries")
    if step.layer == "CDI":
        return CdiError(f"CDI layer: {step.what} of claim {claim} failed: {exc}", reason="cdi")
    return layered(exc, claim)
