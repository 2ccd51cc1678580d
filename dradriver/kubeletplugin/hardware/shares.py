"""Shares of a device (consumable capacity) held to their limits: one MPS control daemon
per device, started by the first share's prepare and stopped by the last one's
unprepare, with each share's limits in its own namespace (MPS v3) or in its environment
(MPS v2). See docs/design.md, "Shares by memory and compute".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dradriver.errors import DaemonError, SharingError
from dradriver.kubeletplugin.daemons.spec import DEVICE, DEVICE_NAME, DaemonRef, shares_name
from dradriver.kubeletplugin.hardware.sharing import Edits, MpsSteps, Save, client_edits
from dradriver.kubeletplugin.state.records import ClaimRecord, PreparedDevice, Share
from dradriver.logs import get_logger
from dradriver.nvml.host import exclusive_process, get_compute_mode, set_compute_mode

log = get_logger("kubeletplugin.shares")
SERVER = "shares"  # the one MPS v3 server of a device's daemon
MIB = 2**20


def share_indices(rec: ClaimRecord) -> list[int]:
    """Where the claim's shares are among its devices (an adminAccess one runs under
    nothing)."""
    return [i for i, d in enumerate(rec.devices) if d.share is not None and not d.admin_access]


def _share(d: PreparedDevice) -> Share:
    assert d.share is not None
    return d.share


@dataclass
class ShareSteps(MpsSteps):
    protocol: Callable[[], int] = lambda: 2  # the MPS protocol the driver speaks

    def _base(self, device: str) -> Path:
        """The daemon's directory: named for the device, so that an undo finds it from
        the ledger's device alone."""
        return self.mps_root / ("shared-" + "".join(c if c.isalnum() else "-" for c in device))

    # -- prepare ---------------------------------------------------------------------------
    def join(self, rec: ClaimRecord, i: int, save: Save) -> ClaimRecord:
        """Sets up the share of `rec`'s `i`th device under the device's daemon (starting
        it if it is the first); the record with the share set up, saved."""
        d = rec.devices[i]
        share, device = _share(d), str(d.uuid)
        base = self._base(device)
        pipe, logs, shm = base / "pipe", base / "log", base / "shm"
        if device not in self.ledger.load().shared:
            self.ledger.shared_daemon(device, gpu="", mode_before=None)
        # A member before the daemon starts and before its namespace is made: a crash
        # anywhere after leaves an entry whose undo (the last member out) stops it.
        self.ledger.member(device, share.share_id, rec.uid)
        if not self.daemons.serving(DaemonRef(shares_name(device))):
            self._start(d, base)
        client, server_side = pipe, False
        if (pipe / SERVER / "control").exists():
            client, server_side = self._namespace(pipe, share), True
        done = dataclasses.replace(
            share,
            pipe_dir=str(client),
            log_dir=str(logs),
            shm_dir=str(shm),
            applied=True,
            server_side=server_side,
        )
        rec = rec.with_device(i, dataclasses.replace(d, share=done))
        save(rec)
        log.info(
            "share set up under the device's MPS daemon",
            claim_uid=rec.uid,
            device=d.device,
            share=share.share_id,
            memory_limit=share.memory_limit,
            compute_limit=share.compute_limit,
            server_side=server_side,
        )
        return rec

    def _start(self, d: PreparedDevice, base: Path) -> None:
        device = str(d.uuid)
        gpu = device if d.kind == "gpu" else ""  # a MIG device's GPU keeps its mode
        before = get_compute_mode(self.nvml, gpu) if gpu else None
        # In the ledger before anything changes; an earlier entry keeps the first mode.
        self.ledger.shared_daemon(device, gpu=gpu, mode_before=before)
        if gpu:
            set_compute_mode(self.nvml, gpu, exclusive_process(self.nvml))
        name = shares_name(device)
        if base.exists():
            # A daemon that is not serving (it exited, or a reboot ended it): what it
            # left goes first, so a new one starts clean, its namespaces made again.
            self.daemons.stop(DaemonRef(name))
            self.drop_dirs(base)
        self.make_dirs(base)
        protocol = self.protocol()
        # A label value: at most 63 characters (GPU-..., MIG-... UUIDs fit).
        serves = ((DEVICE, device[:63]), (DEVICE_NAME, d.device))
        ref = self.start_daemon(base, [device], name=name, serves=serves, protocol=protocol)
        self.wait_serving(ref, base, what=f"MPS control daemon of {device}")
        if protocol == 3:
            create = f"server create {SERVER} --allowed-devices={device}"
            self.host.mps_command(base / "pipe", create)
        log.info(
            "MPS control daemon for a device's shares serving",
            device=device,
            pod=ref.name,
            pod_uid=ref.uid,
        )

    def _namespace(self, pipe: Path, share: Share) -> Path:
        ns = share.namespace
        where = pipe / SERVER / ns
        if not (where / "control").exists():
            self.host.mps_command(pipe, f"namespace create {ns} --server={SERVER}")
        limits = []
        if share.memory_limit is not None:
            limits.append(f"--pinned-memory-limit={max(1, share.memory_limit // MIB)}M")
        if share.compute_limit is not None:
            limits.append(f"--active-thread-percentage={share.compute_limit}")
        if limits:
            self.host.mps_command(pipe, f"namespace set {ns} --server={SERVER} " + " ".join(limits))
        return where

    # -- unprepare -------------------------------------------------------------------------
    def undo(self, rec: ClaimRecord) -> None:
        """Every share of the claim out of its device's daemon (idempotent)."""
        errors = []
        for i in share_indices(rec):
            d = rec.devices[i]
            try:
                self._leave(str(d.uuid), _share(d).share_id)
            except SharingError as exc:
                errors.append(f"device {d.device}: {exc}")
        self.undo_failed(errors)

    def undo_forgotten(self, claim: str) -> None:
        """The shares the ledger holds for `claim`, whose record is gone, undone; raises
        SharingError (the kubelet retries) if one could not be."""
        errors = []
        for device, known in self.ledger.load().shared.items():
            for share_id in [s for s, member in known.members.items() if member == claim]:
                try:
                    self._leave(device, share_id)
                except SharingError as exc:
                    errors.append(f"share {share_id} of {device}: {exc}")
        self.undo_failed(errors)

    def _leave(self, device: str, share_id: str) -> None:
        """Removes the share from its device's daemon; the last one out stops it, puts
        its GPU's compute mode back and drops its directories."""
        left = self.ledger.load().shared.get(device)
        if left is not None and share_id in left.members:
            pipe = self._base(device) / "pipe"
            ns = Share(share_id).namespace
            if (pipe / SERVER / ns / "control").exists() and self.daemons.serving(
                DaemonRef(shares_name(device))
            ):
                self.host.mps_command(pipe, f"namespace delete {ns} --server={SERVER}")
            left = self.ledger.member(device, share_id, None)
        if left is None or left.members:
            return
        try:
            self.daemons.stop(DaemonRef(shares_name(device)))
        except DaemonError as exc:
            raise SharingError(f"MPS control daemon of {device}: {exc}", reason=exc.reason) from exc
        if left.gpu and left.mode_before is not None:
            set_compute_mode(self.nvml, left.gpu, left.mode_before)
        self.drop_dirs(self._base(device))
        self.ledger.shared_stopped(device)
        log.info("MPS control daemon of a device's shares stopped", device=device)

    def recheck(self, rec: ClaimRecord, save: Save) -> ClaimRecord:
        """Startup: a completed claim's shares must be under a running daemon (a reboot
        or a lost daemon ends them), with their namespaces. The record after."""
        for i in share_indices(rec):
            d = rec.devices[i]
            share = _share(d)
            known = self.ledger.load().shared.get(str(d.uuid))
            alive = known is not None and self.daemons.serving(DaemonRef(shares_name(str(d.uuid))))
            if not alive or not (share.pipe_dir and Path(share.pipe_dir, "control").exists()):
                log.warning(
                    "the MPS daemon of a prepared share is gone; setting it up again",
                    claim_uid=rec.uid,
                    share=share.share_id,
                )
                rec = self.join(rec, i, save)
        return rec


def share_edits(d: PreparedDevice) -> Edits:
    """(env, mounts) a share's containers need (pure): the pipe directory of its
    namespace (only that one is mounted) or of the daemon, the daemon's log directory and
    /dev/shm, and where MPS v3 is missing the limits as the client's own variables; then
    what the share was allocated, for the workload to size itself by (a framework's memory
    fraction, a server's worker count): its shareID and the limits prepare derived."""
    share = d.share
    if share is None:
        return [], []
    env: list[str] = []
    mounts: list[tuple[str, str, str]] = []
    if share.pipe_dir:
        env, mounts = client_edits(share.pipe_dir, str(share.log_dir), share.shm_dir)
        if not share.server_side and share.compute_limit is not None:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share.compute_limit}")
        if not share.server_side and share.memory_limit is not None:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={d.uuid}={share.memory_limit // MIB}M")
    env.append(f"DRADRIVER_SHARE_ID={share.share_id}")
    if share.memory_limit is not None:
        env.append(f"DRADRIVER_SHARE_MEMORY_LIMIT={share.memory_limit}")
    if share.compute_limit is not None:
        env.append(f"DRADRIVER_SHARE_COMPUTE_LIMIT={share.compute_limit}")
    return env, mounts
