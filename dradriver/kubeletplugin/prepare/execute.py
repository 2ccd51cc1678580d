"""The prepare executor: applies a claim's record (made by plan.py) step by step, each
hardware change saved in the record before or right after it is taken (the crash points
below are where tests kill the process), and releases it at unprepare; a failed prepare
is rolled back at once. See docs/design.md, "Prepare: read, plan, apply, record".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
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
from dradriver.kubeletplugin.hardware.shares import ShareSteps, share_indices
from dradriver.kubeletplugin.hardware.sharing import SharingSteps
from dradriver.kubeletplugin.prepare import cdi
from dradriver.kubeletplugin.prepare.claim_spec import claim_spec
from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec
from dradriver.kubeletplugin.prepare.steps import (
    Step,
    apply_all,
    ignoring,
    layered,
    nothing,
    undo_all,
)
from dradriver.kubeletplugin.state.journal import Journal, Latest
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimRecord,
)
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
        latest = Latest(journal, rec)
        plan = self.steps(rec, latest)
        try:
            rec = apply_all(plan, rec, latest.seen)
            done = dataclasses.replace(rec, state=PREPARE_COMPLETED, updated_at=now())
            latest.record(done)
            return done
        except Exception as exc:
            self.rollback(journal, latest.rec, plan)
            raise layered(exc, rec.ref) from exc

    def steps(self, rec: ClaimRecord, journal: Journal) -> list[Step]:
        """The claim's hardware work in the order it is applied (steps.py), each step
        recording in `journal` what the next one needs durable first: only what the claim
        uses (a whole GPU on a node without dynamic MIG: its CDI spec alone)."""
        out: list[Step] = []
        mig = self.mig
        for i, d in enumerate(rec.devices):
            if d.carve is not None and mig is not None:
                out.append(
                    Step(
                        "MIG",
                        f"MIG device {d.device}",
                        undo=functools.partial(_uncarve, mig, i),
                        apply=functools.partial(_carve, mig, i, journal=journal),
                    )
                )
        if mig is not None:
            whole = functools.partial(self._whole, mig)
            out.append(Step("MIG", "whole GPUs out of MIG mode", nothing, whole))
        sharing = self.sharing
        if sharing is not None and any(d.sharing is not None for d in rec.devices):
            apply = functools.partial(_sharing, sharing, journal=journal)
            out.append(Step("sharing", "time-slicing and MPS setup", sharing.undo, apply))
        shares = self.shares
        if shares is not None and _has_shares(rec):
            apply = functools.partial(self._shares, shares, journal=journal)
            out.append(
                Step("shares", "shares under their devices' MPS daemons", shares.undo, apply)
            )
        imex = self.imex
        if imex is not None and any(d.imex is not None for d in rec.devices):
            apply = functools.partial(_imex, imex, journal=journal)
            out.append(Step("IMEX", "IMEX daemons", undo=imex.undo, apply=apply))
        out.append(
            Step(
                "CDI",
                "removing the CDI spec",
                undo=lambda r: self.cdi_writer.remove(r.uid),
                apply=self._write_spec,
            )
        )
        return out

    def _whole(self, mig: MigPreparer, rec: ClaimRecord) -> ClaimRecord:
        profiles = self.profiles()
        for d in rec.devices:
            # MIG-capable GPUs only; adminAccess never switches anything.
            if d.kind == "gpu" and d.uuid in profiles and not d.admin_access:
                mig.ensure_whole(str(d.uuid), profiles[str(d.uuid)], d.device, claim=rec.uid)
        return rec

    def _shares(self, shares: ShareSteps, rec: ClaimRecord, *, journal: Journal) -> ClaimRecord:
        for i in share_indices(rec):
            rec = shares.join(rec, i, journal.record)
        crashpoint("sharing-applied")
        if self.pod_memory is not None:
            limited = self.pod_memory.apply(rec, lambda: journal.pod_memory(rec.uid))
            if limited is not None:
                rec = limited
                journal.record(rec)
        return rec

    def _write_spec(self, rec: ClaimRecord) -> ClaimRecord:
        self.write_spec(rec)
        crashpoint("cdi-written")
        return rec

    def write_spec(self, rec: ClaimRecord) -> None:
        """The claim's CDI spec, after the driver spec its devices name."""
        self.ensure_driver_spec(rec)
        self.cdi_writer.write(rec.uid, self.spec(rec))

    def ensure_driver_spec(self, rec: ClaimRecord) -> None:
        if self.driver_spec is None:
            return
        named = cdi.driver_device_id(self.driver)
        if any(named in d.cdi_device_ids for d in rec.devices):
            self.driver_spec.ensure()

    def spec(self, rec: ClaimRecord) -> dict[str, Any]:
        """The claim's CDI spec, from its record and the node's device nodes."""
        return claim_spec(rec, driver=self.driver, host=self.host)

    def rollback(self, journal: Journal, rec: ClaimRecord, plan: list[Step] | None = None) -> None:
        """Immediate rollback: everything created for this claim goes before the error
        returns. What cannot be undone stays recorded for the retry or startup, as
        unfinished (the failure may have come after the record was marked completed)."""
        rec = dataclasses.replace(rec, state=PREPARE_STARTED)
        failed = undo_all(plan or self.steps(rec, journal), rec)
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

    def forgotten_gpus(self, uid: str) -> set[str] | None:
        """The GPUs the ledgers say this driver changed for claim `uid` (whose record is
        gone): what its release_forgotten touches; None if they hold nothing for it."""
        gpus: set[str] = set()
        found = False
        ledger = self.sharing.ledger if self.sharing is not None else None
        if ledger is None and self.shares is not None:
            ledger = self.shares.ledger
        if ledger is not None:
            e = ledger.load()
            found = uid in e.claims()
            gpus |= {g for g, m in e.compute_mode.items() if m.claim == uid}
            gpus |= {g for g, c in e.time_slice.items() if c == uid}
            gpus |= {k for k, sd in e.shared.items() if uid in sd.members.values()}
        if self.imex is not None and self.imex.forgotten(uid):
            found = True  # an IMEX daemon, on no GPU
        if self.mig is not None:
            mine = {i.gpu_uuid for i in self.mig.ledger.instances() if i.claim == uid}
            mine |= {g for g, c in self.mig.ledger.disabled_for().items() if c == uid}
            found = found or bool(mine)
            gpus |= mine
        return gpus if found else None

    def release_forgotten(self, uid: str, ref: str) -> None:
        """Unprepare of a claim the checkpoint does not know: if it was lost (a corrupt
        checkpoint moved aside), the ledgers and the CDI directory still know what was
        done for the claim; undo that now. Nothing recorded: nothing to do."""
        # Nothing is known of it but its name: a record of no device stands for it.
        namespace, _, name = ref.partition("/")
        gone = ClaimRecord(uid, namespace, name, PREPARE_STARTED)
        failed = undo_all(self.forgotten_steps(uid, ref), gone)
        if failed is not None:
            raise failed

    def forgotten_steps(self, uid: str, ref: str) -> list[Step]:
        """What the ledgers hold for claim `uid`, whose record is gone, as steps to undo."""
        out: list[Step] = []
        if (mig := self.mig) is not None:

            def mig_undo(_: ClaimRecord) -> None:
                gpus = mig.release_forgotten(uid)
                if gpus:
                    mig.restore_modes(gpus, self.profiles())
                off = {g for g, c in mig.ledger.disabled_for().items() if c == uid}
                if off:
                    mig.restore_disabled(off, set())

            out.append(Step("MIG", "MIG devices and modes the ledger holds", mig_undo))
        if (sharing := self.sharing) is not None:
            undo = ignoring(functools.partial(sharing.undo_forgotten_claim, uid))
            out.append(Step("sharing", "time-slicing and MPS the ledger holds", undo))
        if (shares := self.shares) is not None:
            undo = ignoring(functools.partial(shares.undo_forgotten, uid))
            out.append(Step("shares", "shares the ledger holds", undo))
        if (imex := self.imex) is not None:
            undo = ignoring(functools.partial(imex.undo_forgotten, uid))
            out.append(Step("IMEX", "IMEX daemons", undo))
        spec = ignoring(functools.partial(self.remove_forgotten_spec, uid, ref))
        out.append(Step("CDI", "removing the CDI spec", spec))
        return out

    def remove_forgotten_spec(self, uid: str, ref: str) -> None:
        """release_forgotten's last step, alone: for a claim forgotten_gpus found no
        ledger entry of (read under the same lock), nothing else is left to undo."""
        if self.cdi_writer.exists(uid):
            try:
                self.cdi_writer.remove(uid)
            except OSError as exc:
                raise CdiError(
                    f"CDI layer: removing the spec of claim {ref} failed: {exc}", reason="cdi"
                ) from exc
            log.info("CDI spec of a claim the checkpoint had lost removed", claim_uid=uid)

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


def _carve(mig: MigPreparer, i: int, rec: ClaimRecord, *, journal: Journal) -> ClaimRecord:
    rec = rec.with_device(i, mig.carve(rec.devices[i], rec.uid))
    journal.record(rec)  # the created instance, before anything else
    crashpoint("mig-recorded")
    return rec


def _uncarve(mig: MigPreparer, i: int, rec: ClaimRecord) -> None:
    mig.uncarve(rec.devices[i], rec.uid)


def _sharing(sharing: SharingSteps, rec: ClaimRecord, *, journal: Journal) -> ClaimRecord:
    rec = sharing.apply(rec, journal.record)
    crashpoint("sharing-applied")
    return rec


def _imex(imex: ImexSteps, rec: ClaimRecord, *, journal: Journal) -> ClaimRecord:
    rec = imex.apply(rec, journal.record)
    crashpoint("imex-started")
    return rec
