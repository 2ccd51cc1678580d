"""The prepare executor: applies a claim's record (made by plan.py) step by step, and
releases it at unprepare. Every step that changes the hardware is saved in the record
before or right after it is taken, so a crash at any point (the crash points below are
where tests kill the process) leaves a checkpoint from which startup finishes or undoes
the work. A failed prepare is rolled back at once: nothing it created outlives the error.
"""

from __future__ import annotations

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
from dradriver.kubeletplugin.hardware.shares import share_edits
from dradriver.kubeletplugin.hardware.sharing import SharingSteps, container_edits
from dradriver.kubeletplugin.prepare import cdi
from dradriver.kubeletplugin.prepare.driver_spec import DriverSpec
from dradriver.kubeletplugin.state.journal import Journal
from dradriver.kubeletplugin.state.records import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimRecord,
    PreparedDevice,
)
from dradriver.logs import get_logger
from dradriver.nvml.host import DeviceNode, GpuHost

log = get_logger("kubeletplugin.execute")


def _layered(exc: Exception, claim: str) -> DriverError:
    """A step's failure as the per-claim error the kubelet shows, naming the layer."""
    if isinstance(exc, DriverError):
        prefix = {"MIG": "MIG layer: ", "sharing": "sharing layer: ", "IMEX": "IMEX layer: "}.get(
            exc.layer, ""
        )
        return exc.retold(f"claim {claim}: {prefix}{exc}")
    if isinstance(exc, OSError):
        return CheckpointError(f"claim {claim}: checkpoint layer: {exc}", reason="checkpoint")
    if isinstance(exc, ValueError):
        return CdiError(f"claim {claim}: {exc}", reason="cdi_spec")
    return DriverError(f"claim {claim}: {type(exc).__name__}: {exc}", reason="other")


@dataclass
class Executor:
    driver: str
    cdi_writer: cdi.CdiWriter
    host: GpuHost
    # GPU UUID -> its MIG profile IDs, for finding instances when restoring MIG modes.
    profiles: Callable[[], dict[str, list[int]]]
    mig: MigPreparer | None = None
    sharing: SharingSteps | None = None
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
        shares = any(d.share is not None and not d.admin_access for d in rec.devices)
        if (shares or any(d.sharing is not None for d in rec.devices)) and self.sharing is None:
            raise SharingError(f"claim {rec.ref}: sharing is not available on this node")
        if any(d.imex is not None for d in rec.devices) and self.imex is None:
            raise ImexError(
                f"claim {rec.ref}: IMEX channels are not prepared on this node (the plugin "
                "runs with --imex-channels off)"
            )

    def apply(
        self,
        journal: Journal,
        rec: ClaimRecord,
        now: Callable[[], float],
        intent_recorded: bool = False,
    ) -> None:
        """Applies `rec` (in state PrepareStarted) and marks it completed, recording each
        step in `journal`. On failure everything it did is undone and the error (a
        DriverError) names the layer. `intent_recorded`: the caller has already made
        `rec` durable as it is (the intent), so the first hardware step may start."""
        self.check(rec)
        carving = [d for d in rec.devices if d.carve is not None]
        shared = [
            d
            for d in rec.devices
            if d.sharing is not None or (d.share is not None and not d.admin_access)
        ]
        channels = [d for d in rec.devices if d.imex is not None]
        try:
            if carving or shared or channels:
                if not intent_recorded:
                    journal.record(rec)  # intent first: a crash from here on is recoverable
                crashpoint("intent-recorded")
            for d in carving:
                assert self.mig is not None
                self.mig.carve(d, rec.uid)
                journal.record(rec)  # the created instance, before anything else
                crashpoint("mig-recorded")
            if self.mig is not None:
                profiles = self.profiles()
                for d in rec.devices:
                    # MIG-capable GPUs only; adminAccess never switches anything.
                    if d.kind == "gpu" and d.uuid in profiles and not d.admin_access:
                        self.mig.ensure_whole(str(d.uuid), profiles[str(d.uuid)], d.device, rec.uid)
            if shared:
                assert self.sharing is not None
                self.sharing.apply(rec, lambda: journal.record(rec))
                crashpoint("sharing-applied")
                if self.pod_memory is not None and self.pod_memory.apply(
                    rec, lambda: journal.pod_memory(rec.uid)
                ):
                    journal.record(rec)
            if channels:
                assert self.imex is not None
                self.imex.apply(rec, lambda: journal.record(rec))
                crashpoint("imex-started")
            self.write_spec(rec)
            crashpoint("cdi-written")
            rec.state = PREPARE_COMPLETED
            rec.updated_at = now()
            journal.record(rec)
        except Exception as exc:
            self.rollback(journal, rec)
            raise _layered(exc, rec.ref) from exc

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
        devices = []
        for d in rec.devices:
            env, mounts = container_edits(d)
            more_env, more_mounts = share_edits(d)
            env += more_env + share_env(d)
            mounts += more_mounts
            if d.imex is not None:
                devices.append(imex_device(d, self.host.imex_channel_node(d.imex.channel)))
                continue
            nodes = self.host.device_nodes(d.minor, d.mig_ids())
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
            control_nodes=self.host.control_device_nodes(),
        )

    def rollback(self, journal: Journal, rec: ClaimRecord) -> None:
        """Immediate rollback: everything created for this claim goes before the error
        returns. A step that cannot be undone stays recorded for startup to retry, as
        unfinished (the failure may have come after the record was marked completed)."""
        rec.state = PREPARE_STARTED
        keep = False
        if self.imex is not None:
            self.imex.undo(rec)
        if self.sharing is not None:
            try:
                self.sharing.undo(rec)
            except SharingError as exc:
                keep = True
                log.error(
                    "rollback could not undo the sharing setup", claim_uid=rec.uid, error=str(exc)
                )
        for d in rec.devices:
            if d.carve is not None and self.mig is not None:
                try:
                    self.mig.uncarve(d, rec.uid)
                except MigError as exc:
                    keep = True
                    log.error(
                        "rollback could not destroy a MIG device",
                        claim_uid=rec.uid,
                        device=d.device,
                        error=str(exc),
                    )
        try:
            self.cdi_writer.remove(rec.uid)
        except (OSError, ValueError) as exc:
            log.error("rollback could not remove the CDI spec", claim_uid=rec.uid, error=str(exc))
        try:
            if keep:
                journal.record(rec)
            else:
                journal.forget(rec)
        except (OSError, DriverError) as exc:
            log.error("rollback could not save the checkpoint", claim_uid=rec.uid, error=str(exc))
        self.restore_mig_modes(rec, journal)

    @staticmethod
    def needs_intent(rec: ClaimRecord) -> bool:
        """Whether the claim's hardware work must be recorded before it starts: a carve,
        a sharing setup, a share, an IMEX daemon (a MIG mode switch is in its ledger)."""
        return any(
            d.carve or d.sharing or d.share or d.imex for d in rec.devices if not d.admin_access
        )

    # -- unprepare -------------------------------------------------------------------------
    def simple(self, rec: ClaimRecord) -> bool:
        """Nothing but a CDI spec and the record: no MIG device, MIG mode or sharing
        setup, so it is done in one step under the node lock, with one save."""
        return (
            self.mig is None
            and rec.migrated_from is None  # its record may not say all: the ledgers do
            and all(
                d.carve is None
                and d.sharing is None
                and d.imex is None
                and (d.share is None or d.admin_access)
                for d in rec.devices
            )
        )

    def release(self, journal: Journal, rec: ClaimRecord) -> None:
        """Undoes a prepared (or half-prepared) claim and forgets it. A step that fails
        raises a DriverError and leaves the record, so the kubelet's retry finishes it."""
        if self.imex is not None:
            self.imex.undo(rec)
        if self.sharing is not None:
            try:
                self.sharing.undo(rec)
            except SharingError as exc:
                raise exc.retold(
                    f"sharing layer: claim {rec.ref}: {exc}; the kubelet retries"
                ) from exc
        for d in rec.devices:
            if d.carve is not None and self.mig is not None:
                try:
                    self.mig.uncarve(d, rec.uid)
                except MigError as exc:
                    hint = " (a process still uses it)" if exc.in_use else ""
                    raise exc.retold(
                        f"MIG layer: claim {rec.ref}: device {d.device}: {exc}{hint}; "
                        "the kubelet retries"
                    ) from exc
        if rec.migrated_from is not None and self.mig is not None:
            # Migrated from a format without MIG records: the ledger knows what was
            # carved for the claim (the sharing undo above asked its ledger too).
            try:
                gpus = self.mig.release_forgotten(rec.uid)
            except MigError as exc:
                raise exc.retold(f"MIG layer: claim {rec.ref}: {exc}; the kubelet retries") from exc
            if gpus:
                self.mig.restore_modes(gpus, self.profiles())
        try:
            self.cdi_writer.remove(rec.uid)
        except OSError as exc:
            raise CdiError(
                f"CDI layer: removing the spec of claim {rec.ref} failed: {exc}", reason="cdi"
            ) from exc
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
        if self.sharing is not None:
            e = self.sharing.ledger.load()
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
        if self.imex is not None:
            self.imex.undo_forgotten(uid)
        if self.sharing is not None:
            try:
                self.sharing.undo_forgotten_claim(uid)
            except SharingError as exc:
                raise exc.retold(f"sharing layer: claim {ref}: {exc}; the kubelet retries") from exc
        if self.mig is not None:
            try:
                gpus = self.mig.release_forgotten(uid)
            except MigError as exc:
                raise exc.retold(f"MIG layer: claim {ref}: {exc}; the kubelet retries") from exc
            if gpus:
                self.mig.restore_modes(gpus, self.profiles())
            off = {g for g, c in self.mig.ledger.disabled_for().items() if c == uid}
            if off:
                self.mig.restore_disabled(off, set())
        self.remove_forgotten_spec(uid, ref)

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


def imex_device(d: PreparedDevice, node: DeviceNode) -> cdi.CdiDevice:
    """An IMEX channel in the container: its device node, and which domain and channel."""
    assert d.imex is not None
    return cdi.CdiDevice(
        name=d.cdi_name,
        device=d.device,
        uuid="",
        device_nodes=(node,),
        group=",".join(d.request_names),
        env=(
            f"DRADRIVER_IMEX_CHANNEL={d.imex.channel}",
            f"DRADRIVER_COMPUTE_DOMAIN={d.imex.namespace}/{d.imex.domain}",
        ),
        gpu=False,
    )


def share_env(d: PreparedDevice) -> list[str]:
    """What a share was allocated, for the workload to size itself by (a framework's
    memory fraction, a server's worker count): the shareID and the limits prepare
    derived from the allocation (prepare/shares.py)."""
    if d.share is None:
        return []
    env = [f"DRADRIVER_SHARE_ID={d.share.share_id}"]
    if d.share.memory_limit is not None:
        env.append(f"DRADRIVER_SHARE_MEMORY_LIMIT={d.share.memory_limit}")
    if d.share.compute_limit is not None:
        env.append(f"DRADRIVER_SHARE_COMPUTE_LIMIT={d.share.compute_limit}")
    return env
