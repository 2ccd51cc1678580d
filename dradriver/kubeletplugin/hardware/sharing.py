"""The sharing steps of prepare and unprepare: a time-slice interval, or an MPS control
daemon with limits, applied as the claim's record says (prepare/plan.py decided it) and
undone exactly, each change in the ledger first (docs/design.md, "Sharing:
time-slicing and MPS").
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver.errors import DaemonError, SharingError
from dradriver.kubeletplugin.daemons import Daemons
from dradriver.kubeletplugin.daemons.spec import CLAIM, DaemonRef, DaemonSpec, Labels, mps_name
from dradriver.kubeletplugin.state.ledger import Ledger
from dradriver.kubeletplugin.state.records import ClaimRecord, Mps, PreparedDevice, TimeSlicing
from dradriver.logs import get_logger
from dradriver.nvml.host import GpuHost, exclusive_process, get_compute_mode, set_compute_mode

log = get_logger("kubeletplugin.sharing")
Save = Callable[[ClaimRecord], None]  # makes a record durable
Edits = tuple[list[str], list[tuple[str, str, str]]]  # a container's env and mounts


# The /dev/shm of an MPS daemon and its clients: CUDA's MPS client and server exchange
# memory there, and the application's own use (a data loader's) comes out of it too. A
# container's default is 64 MiB; this is what `--mps-shm-size` sets otherwise.
MPS_SHM_SIZE = 1 << 30
# The daemon's pipe and log directories, each a tmpfs of its own (the pipe holds its
# control pipes and, with MPS v3, a directory per namespace; the log its two logs).
PIPE_SIZE = 4 << 20
LOG_SIZE = 64 << 20


# How long a prepare waits for a daemon's pod to serve: the image is the plugin's own,
# already on the node, so a start takes seconds; past this the kubelet retries.
DAEMON_START_TIMEOUT = 30.0


def mps_groups(rec: ClaimRecord) -> dict[str, list[int]]:
    """Where the claim's MPS devices are among its devices, by limits group: one daemon
    per group."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(rec.devices):
        if isinstance(d.sharing, Mps):
            groups.setdefault(d.sharing.group, []).append(i)
    return groups


def _with_mps(rec: ClaimRecord, members: list[int], **changes: Any) -> ClaimRecord:
    for i in members:
        d = rec.devices[i]
        assert isinstance(d.sharing, Mps)
        sharing = dataclasses.replace(d.sharing, **changes)
        rec = rec.with_device(i, dataclasses.replace(d, sharing=sharing))
    return rec


def daemon_of(sh: Mps) -> DaemonRef:
    """The daemon's pod: as recorded, or by the name its directory (<claim uid>-<group
    index> under the MPS root) gives (a crash came between its creation and the record)."""
    return sh.daemon or DaemonRef("mps-" + Path(str(sh.pipe_dir)).parent.name)


@dataclass
class MpsSteps:
    """What a claim's MPS daemons (SharingSteps) and a device's shares' daemon
    (shares.ShareSteps) both stand on: each daemon a pod with its directories under
    <mps_root>/<its own>/."""

    nvml: ModuleType  # compute mode goes through NVML
    host: GpuHost  # time-slicing, the daemons' directories and command lie outside it
    daemons: Daemons  # where the MPS daemons run (their pods)
    mps_root: Path  # <state dir>/mps: one directory per daemon
    ledger: Ledger  # every compute mode and interval changed, before the change
    shm_size: int = MPS_SHM_SIZE  # bytes: the daemon's and its clients' /dev/shm (a tmpfs)

    def make_dirs(self, base: Path) -> bool:
        """A daemon's pipe, log and /dev/shm directories under `base`, each a tmpfs with
        an explicit mode (never the disk of the state directory: a container writing there
        would fill the disk that holds the checkpoint); True when its /dev/shm is new (made
        now: a reboot took the old one)."""
        self.host.make_tmpfs(base / "pipe", size=PIPE_SIZE, mode=0o755)
        self.host.make_tmpfs(base / "log", size=LOG_SIZE, mode=0o755)
        # Mode 1777: every container user may write it, only its owner remove.
        return self.host.make_tmpfs(base / "shm", size=self.shm_size, mode=0o1777)

    def drop_dirs(self, base: Path) -> None:
        """What make_dirs made, unmounted first (removing the files of a mounted tmpfs
        would leave the mount behind), then `base`."""
        for name in ("shm", "log", "pipe"):
            self.host.drop_tmpfs(base / name)
        shutil.rmtree(base, ignore_errors=True)

    def start_daemon(
        self, base: Path, uuids: list[str], *, name: str, serves: Labels, protocol: int = 2
    ) -> DaemonRef:
        """The MPS control daemon of `uuids` with its directories under `base`: its pod
        `name` made, or found (never a second daemon for them)."""
        pipe, logs, shm = base / "pipe", base / "log", base / "shm"
        spec = DaemonSpec(
            name=name,
            role="mps",
            serves=serves,
            command=self.host.mps_daemon(uuids, pipe, logs, shm_dir=shm, protocol=protocol),
            dirs=(str(pipe), str(logs)),
            shm=str(shm),
        )
        return self.daemons.start(spec)

    @staticmethod
    def undo_failed(errors: list[str]) -> None:
        """What an undo could not do, as one SharingError (the kubelet retries)."""
        if errors:
            raise SharingError("; ".join(errors), reason="undo")

    def wait_serving(self, ref: DaemonRef, base: Path, *, what: str) -> None:
        """Waits for the daemon `ref` to open its control pipe; SharingError naming `what`
        (the kubelet retries) when it does not in time."""
        try:
            self.daemons.wait(ref, (base / "pipe" / "control").exists, timeout=DAEMON_START_TIMEOUT)
        except DaemonError as exc:
            raise SharingError(f"{what}: {exc}; the kubelet retries", reason=exc.reason) from exc


@dataclass
class SharingSteps(MpsSteps):
    def apply(self, rec: ClaimRecord, save: Save) -> ClaimRecord:
        """Applies the claim's time-slicing and MPS setups; `save(rec)` persists the
        record after each change so a crash never loses track of one. The record after."""
        for i, d in enumerate(rec.devices):
            sh = d.sharing
            if isinstance(sh, TimeSlicing) and d.kind == "gpu":
                self.ledger.slice_changing(str(d.uuid), rec.uid)
                self.host.set_timeslice(str(d.uuid), sh.interval)
                applied = dataclasses.replace(sh, applied=True)
                rec = rec.with_device(i, dataclasses.replace(d, sharing=applied))
                save(rec)
                log.info(
                    "time-slicing applied", claim_uid=rec.uid, device=d.device, interval=sh.interval
                )
        for group, members in mps_groups(rec).items():
            rec = self._start_mps(rec, group, members, save=save)
        return rec

    def _start_mps(
        self, rec: ClaimRecord, group: str, members: list[int], *, save: Save
    ) -> ClaimRecord:
        index = sorted(mps_groups(rec)).index(group)
        base = self.mps_root / f"{rec.uid}-{index}"
        pipe, logs, shm = base / "pipe", base / "log", base / "shm"
        fresh = self.make_dirs(base)  # the claim's own
        rec = _with_mps(rec, members, pipe_dir=str(pipe), log_dir=str(logs), shm_dir=str(shm))
        save(rec)
        devs = [rec.devices[i] for i in members]
        for gpu in [str(d.uuid) for d in devs if d.kind == "gpu"]:
            # In the ledger before it changes (the undo's one source for the mode to
            # restore); an earlier entry (this claim's setup being redone after a
            # restart) keeps what the GPU had before us.
            self.ledger.mode_changing(gpu, get_compute_mode(self.nvml, gpu), rec.uid)
            set_compute_mode(self.nvml, gpu, exclusive_process(self.nvml))
        name = mps_name(rec.uid, index)
        if fresh:
            # A new /dev/shm (a reboot took the old tmpfs): a daemon still running on the
            # old one would share nothing with the clients started now.
            self.daemons.stop(DaemonRef(name))
        # The pod is found by its name (one per group: never a second daemon for it), or
        # made; recorded before it is waited for, so a crash leaves it known.
        uuids = [str(d.uuid) for d in devs]
        ref = self.start_daemon(base, uuids, name=name, serves=((CLAIM, rec.uid),))
        rec = _with_mps(rec, members, daemon=ref)
        save(rec)
        self.wait_serving(ref, base, what="MPS control daemon")
        rec = _with_mps(rec, members, applied=True)
        save(rec)
        log.info(
            "MPS control daemon serving",
            claim_uid=rec.uid,
            pod=ref.name,
            pod_uid=ref.uid,
            devices=",".join(d.device for d in devs),
            pipe_dir=str(pipe),
        )
        return rec

    def undo(self, rec: ClaimRecord) -> None:
        """Stops daemons, restores compute modes and intervals; idempotent."""
        errors: list[str] = []
        stopped: set[str] = set()
        ledger = self.ledger.load()
        for d in rec.devices:
            sh = d.sharing
            try:
                if isinstance(sh, TimeSlicing) and d.kind == "gpu" and d.uuid in ledger.time_slice:
                    self.host.set_timeslice(str(d.uuid), "Default")
                    self.ledger.slice_restored(str(d.uuid))
                if not isinstance(sh, Mps) or not sh.pipe_dir:
                    continue
                # One daemon per group: stopped once, by its first device.
                ref = daemon_of(sh)
                if ref.name not in stopped:
                    self.daemons.stop(ref)
                    log.info("MPS control daemon stopped", claim_uid=rec.uid, pod=ref.name)
                    stopped.add(ref.name)
                change = ledger.compute_mode.get(str(d.uuid))
                if change is not None:
                    set_compute_mode(self.nvml, str(d.uuid), change.before)
                    self.ledger.mode_restored(str(d.uuid))
                self.drop_dirs(Path(sh.pipe_dir).parent)
            except (SharingError, DaemonError) as exc:
                errors.append(f"device {d.device}: {exc}")
        self.undo_failed(errors)

    def report_forgotten(self, known_claims: set[str]) -> None:
        """Startup: says what the ledger holds for claims the checkpoint does not (it was
        lost or moved aside). Left running: the claim's pods may still use it; the
        kubelet's unprepare of the claim undoes it (undo_forgotten_claim)."""
        e = self.ledger.load()
        pods: dict[str, list[str]] = {}
        try:
            for ref, labels in self.daemons.find("mps"):
                if CLAIM in labels:
                    pods.setdefault(labels[CLAIM], []).append(ref.name)
        except DaemonError as exc:
            log.warning("could not list this node's MPS daemon pods", error=str(exc))
        for claim in sorted((e.sharing_claims() | set(pods)) - known_claims):
            log.warning(
                "sharing setup of a claim the checkpoint does not hold: kept until the "
                "kubelet unprepares the claim",
                claim_uid=claim,
                daemons=",".join(pods.get(claim, [])),
                compute_mode_gpus=",".join(
                    g for g, m in e.compute_mode.items() if m.claim == claim
                ),
                time_slice_gpus=",".join(g for g, c in e.time_slice.items() if c == claim),
            )

    def undo_forgotten_claim(self, claim: str) -> None:
        """Undoes what the ledger holds for `claim`, whose record is gone: daemons
        stopped, compute modes and intervals back to what they were. Raises SharingError
        (the kubelet retries) if something could not be undone."""
        e = self.ledger.load()
        errors: list[str] = []
        try:
            for ref, _ in self.daemons.find("mps", **{CLAIM: claim}):
                self.daemons.stop(ref)
                log.info("MPS daemon of a forgotten claim stopped", claim_uid=claim, pod=ref.name)
            for base in sorted(self.mps_root.glob(f"{claim}-*")):
                self.drop_dirs(base)
        except DaemonError as exc:
            errors.append(f"MPS daemons: {exc}")
        for gpu, before in [(g, m.before) for g, m in e.compute_mode.items() if m.claim == claim]:
            try:
                set_compute_mode(self.nvml, gpu, before)
                self.ledger.mode_restored(gpu)
                log.info("compute mode of a forgotten claim restored", claim_uid=claim, gpu=gpu)
            except SharingError as exc:
                errors.append(f"GPU {gpu}: {exc}")
        for gpu in [g for g, holder in e.time_slice.items() if holder == claim]:
            try:
                self.host.set_timeslice(gpu, "Default")
                self.ledger.slice_restored(gpu)
            except SharingError as exc:
                errors.append(f"GPU {gpu}: {exc}")
        self.undo_failed(errors)

    def recheck(self, rec: ClaimRecord, save: Save) -> ClaimRecord:
        """Startup: a completed claim's MPS daemon must be running (a reboot ends it).
        The record after."""
        for group, members in mps_groups(rec).items():
            sh = rec.devices[members[0]].sharing
            assert isinstance(sh, Mps)
            if sh.pipe_dir is None or not self.daemons.serving(daemon_of(sh)):
                log.warning(
                    "MPS control daemon of a prepared claim is not serving; starting it again",
                    claim_uid=rec.uid,
                    pod=daemon_of(sh).name if sh.pipe_dir else "",
                )
                rec = self._start_mps(rec, group, members, save=save)
        return rec


def container_edits(d: PreparedDevice) -> Edits:
    """(env, mounts) a container needs for the device's sharing setup (pure): an MPS
    client's, with the group's limits as its own variables."""
    sh = d.sharing
    if not isinstance(sh, Mps) or not sh.pipe_dir:
        return [], []
    env, mounts = client_edits(sh.pipe_dir, str(sh.log_dir), sh.shm_dir)
    limits = sh.limits
    if limits.active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={limits.active_thread_percentage}")
    pinned = dict(limits.per_device_pinned)
    if limits.pinned_memory_limit is not None:
        pinned.setdefault(str(d.uuid), limits.pinned_memory_limit)
    if pinned:
        each = ",".join(f"{k}={_mps_quantity(v)}" for k, v in sorted(pinned.items()))
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={each}")
    return env, mounts


def client_edits(pipe: str, logs: str, shm: str | None) -> Edits:
    """(env, mounts as (host path, container path, options)) of an MPS client of the
    daemon with these directories: it is told its pipe and log directories, and mounts
    the pipe directory (to talk to it), the log directory read-only (the daemon, as root,
    writes there: a client that could plant a link would have it write elsewhere), and
    /dev/shm (where server and clients exchange memory)."""
    env = [f"CUDA_MPS_PIPE_DIRECTORY={pipe}", f"CUDA_MPS_LOG_DIRECTORY={logs}"]
    mounts = [(pipe, pipe, "rw"), (logs, logs, "ro")]
    if shm:
        mounts.append((shm, "/dev/shm", "rw"))
    return env, mounts


def _mps_quantity(q: str) -> str:
    """MPS wants its limits in M or G: Kubernetes quantities are converted."""
    # Only a claim with an MPS config gets here: the config models load with it.
    from dradriver.api.config import quantity_bytes

    return f"{quantity_bytes(q) // 2**20}M"
