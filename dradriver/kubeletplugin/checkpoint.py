"""What this node has prepared, kept on disk so that a restarted, upgraded or rebooted
plugin finishes or undoes its work instead of forgetting it.

The file must never take the plugin down: peers crash-looped on checkpoints written by
another release and on corrupt ones. Here an older format is migrated, a newer one is read
as far as it is understood, and a damaged one is moved aside (kept for a human) while the
plugin carries on with an empty state.

File layout (version 1)::

    {"version": 1, "checksum": "sha256:<hex>", "payload": {"bootId": ..., "claims": {...}}}

"version", "checksum" and "payload" are the envelope every release must keep, so that an
older release can still verify and partly read a newer file. The checksum covers the
canonical JSON of the payload (sorted keys, no spaces, ASCII), so a torn write or a hand
edit is detected rather than trusted.

Readers and writers on one node (two plugin instances during a rolling update) serialize
through FileLock; CheckpointStore itself does no locking.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dradriver.logs import get_logger

log = get_logger("kubeletplugin.checkpoint")

CURRENT_VERSION: Final = 1
PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
STATES: Final = (PREPARE_STARTED, PREPARE_COMPLETED)
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"

# A temp file lives for milliseconds; one this old was left by a crash mid-write.
_STALE_TEMP_SECONDS = 600.0


# -- data model ------------------------------------------------------------------------------


@dataclass
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet, plus what unprepare and
    a rewrite of the CDI spec need to know about it."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    uuid: str | None = None
    kind: str = "gpu"
    # Per-device facts of later features (MIG placement, created GI/CI ids, sharing setup).
    # Must be JSON-serialisable.
    extra: dict[str, Any] = field(default_factory=dict)
    # Fields written by a newer release; written back unchanged so a downgrade followed by
    # an upgrade does not lose them.
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str  # PREPARE_STARTED or PREPARE_COMPLETED
    devices: list[PreparedDevice] = field(default_factory=list)
    updated_at: float = 0.0  # epoch seconds; 0.0 when migrated from a format without it
    extra: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Checkpoint:
    # The format the data was read in (CURRENT_VERSION for a new or saved checkpoint):
    # lets the caller see that a migration happened.
    version: int = CURRENT_VERSION
    boot_id: str = ""  # the boot during which the file was last written
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)
    # The boot ID of the system that loaded this checkpoint; set by CheckpointStore.load,
    # never stored. It lets reconcile_boot(cp) stay a pure function of its argument.
    running_boot_id: str | None = field(default=None, compare=False, repr=False)


class CheckpointCorrupt(ValueError):
    """The bytes are not a checkpoint this release can trust."""


# -- encoding --------------------------------------------------------------------------------

_DEVICE_KEYS = ("requestNames", "pool", "device", "cdiDeviceIds", "uuid", "kind", "extra")
_CLAIM_KEYS = ("uid", "namespace", "name", "state", "devices", "updatedAt", "extra")
_PAYLOAD_KEYS = ("bootId", "claims")


def _canonical(payload: Any) -> bytes:
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def payload_checksum(payload: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(payload)).hexdigest()


def _device_json(d: PreparedDevice) -> dict[str, Any]:
    return {
        **d.unknown,
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiDeviceIds": list(d.cdi_device_ids),
        "uuid": d.uuid,
        "kind": d.kind,
        "extra": d.extra,
    }


def _claim_json(c: ClaimRecord) -> dict[str, Any]:
    return {
        **c.unknown,
        "uid": c.uid,
        "namespace": c.namespace,
        "name": c.name,
        "state": c.state,
        "devices": [_device_json(d) for d in c.devices],
        "updatedAt": c.updated_at,
        "extra": c.extra,
    }


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The file content for `cp`, always in the current format. Raises ValueError or
    TypeError if an `extra` holds something JSON cannot represent."""
    for uid, rec in cp.claims.items():
        if uid != rec.uid:
            raise ValueError(f"checkpoint: claim stored under {uid!r} has uid {rec.uid!r}")
        if rec.state not in STATES:
            raise ValueError(f"checkpoint: claim {uid} has unknown state {rec.state!r}")
    payload = {
        **cp.unknown,
        "bootId": cp.boot_id,
        "claims": {uid: _claim_json(rec) for uid, rec in cp.claims.items()},
    }
    doc = {"version": CURRENT_VERSION, "checksum": payload_checksum(payload), "payload": payload}
    return (json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


# -- decoding --------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise CheckpointCorrupt(f"not valid JSON: {name} is not a JSON number")


def _get(obj: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise CheckpointCorrupt(f"{where}: missing {key!r}")
    value = obj[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    # bool is an int in Python but never a valid number field here.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise CheckpointCorrupt(f"{where}.{key}: expected {_type_name(typ)}, got {value!r:.60}")
    return value


def _type_name(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _str_list(obj: dict[str, Any], key: str, where: str) -> list[str]:
    value = _get(obj, key, list, where)
    if not all(isinstance(v, str) for v in value):
        raise CheckpointCorrupt(f"{where}.{key}: expected a list of strings")
    return list(value)


def _optional(obj: dict[str, Any], key: str, typ: type, default: Any, where: str) -> Any:
    if key not in obj or obj[key] is None:
        return default
    return _get(obj, key, typ, where)


def _unknown(obj: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


def _decode_device(obj: Any, where: str) -> PreparedDevice:
    if not isinstance(obj, dict):
        raise CheckpointCorrupt(f"{where}: expected an object")
    return PreparedDevice(
        request_names=_str_list(obj, "requestNames", where),
        pool=_get(obj, "pool", str, where),
        device=_get(obj, "device", str, where),
        cdi_device_ids=_str_list(obj, "cdiDeviceIds", where),
        uuid=_optional(obj, "uuid", str, None, where),
        kind=_optional(obj, "kind", str, "gpu", where),
        extra=dict(_optional(obj, "extra", dict, {}, where)),
        unknown=_unknown(obj, _DEVICE_KEYS),
    )


def _decode_claim(key: str, obj: Any, newer: bool, notes: list[str]) -> ClaimRecord:
    where = f"claims[{key!r}]"
    if not isinstance(obj, dict):
        raise CheckpointCorrupt(f"{where}: expected an object")
    uid = _get(obj, "uid", str, where)
    if uid != key:
        raise CheckpointCorrupt(f"{where}: stored under another UID than its own ({uid!r})")
    state = _get(obj, "state", str, where)
    if state not in STATES:
        if not newer:
            raise CheckpointCorrupt(f"{where}.state: unknown state {state!r}")
        # A state from a newer release says nothing this release can rely on: like an
        # unfinished prepare, the caller has to undo or redo it.
        notes.append(
            f"claim {uid}: unknown state {state!r} from a newer release, "
            f"treated as {PREPARE_STARTED}"
        )
        state = PREPARE_STARTED
    devices = _get(obj, "devices", list, where)
    return ClaimRecord(
        uid=uid,
        namespace=_get(obj, "namespace", str, where),
        name=_get(obj, "name", str, where),
        state=state,
        devices=[_decode_device(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)],
        updated_at=float(_get(obj, "updatedAt", (int, float), where)),
        extra=dict(_optional(obj, "extra", dict, {}, where)),
        unknown=_unknown(obj, _CLAIM_KEYS),
    )


def _from_v0(doc: dict[str, Any], notes: list[str]) -> Checkpoint:
    """Version 0 (releases before versioning; "version" is 0 or absent):

        {"bootId": "...", "claims": [{"uid", "namespace", "name",
          "devices": [{"request", "pool", "device", "cdiDeviceIds", "uuid"?}]}]}

    No states (a claim was written only once prepared, so all are completed), no
    checksum, one request name per device, no timestamps.
    """
    claims: dict[str, ClaimRecord] = {}
    for i, obj in enumerate(_get(doc, "claims", list, "checkpoint")):
        where = f"claims[{i}]"
        if not isinstance(obj, dict):
            raise CheckpointCorrupt(f"{where}: expected an object")
        devices = []
        for j, d in enumerate(_get(obj, "devices", list, where)):
            dw = f"{where}.devices[{j}]"
            if not isinstance(d, dict):
                raise CheckpointCorrupt(f"{dw}: expected an object")
            devices.append(
                PreparedDevice(
                    request_names=[_get(d, "request", str, dw)],
                    pool=_get(d, "pool", str, dw),
                    device=_get(d, "device", str, dw),
                    cdi_device_ids=_str_list(d, "cdiDeviceIds", dw),
                    uuid=_optional(d, "uuid", str, None, dw),
                )
            )
        rec = ClaimRecord(
            uid=_get(obj, "uid", str, where),
            namespace=_get(obj, "namespace", str, where),
            name=_get(obj, "name", str, where),
            state=PREPARE_COMPLETED,
            devices=devices,
        )
        if rec.uid in claims:
            raise CheckpointCorrupt(f"{where}: claim {rec.uid} listed twice")
        claims[rec.uid] = rec
    notes.append(f"migrated {len(claims)} claims from checkpoint version 0")
    return Checkpoint(
        version=0, boot_id=_optional(doc, "bootId", str, "", "checkpoint"), claims=claims
    )


def parse_checkpoint(data: bytes) -> tuple[Checkpoint, list[str]]:
    """Decodes a checkpoint file of any version this release knows how to read.

    Returns the checkpoint and notes worth a warning (migration, newer release, unknown
    fields). Raises CheckpointCorrupt for anything that cannot be trusted.
    """
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorrupt(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointCorrupt("not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise CheckpointCorrupt("expected a JSON object at the top level")
    notes: list[str] = []
    if "version" not in doc:
        return _from_v0(doc, notes), notes
    version = _get(doc, "version", int, "checkpoint")
    if version < 0:
        raise CheckpointCorrupt(f"checkpoint.version: {version} is not a version")
    if version == 0:
        return _from_v0(doc, notes), notes
    newer = version > CURRENT_VERSION
    if newer:
        notes.append(
            f"checkpoint version {version} was written by a newer release; "
            f"reading the version {CURRENT_VERSION} fields it still has"
        )
    payload = _get(doc, "payload", dict, "checkpoint")
    checksum = _get(doc, "checksum", str, "checkpoint")
    if checksum != payload_checksum(payload):
        raise CheckpointCorrupt("checksum mismatch: torn write or edited by hand")
    claims_obj = _get(payload, "claims", dict, "payload")
    cp = Checkpoint(
        version=version,
        boot_id=_get(payload, "bootId", str, "payload"),
        claims={k: _decode_claim(k, v, newer, notes) for k, v in claims_obj.items()},
        unknown=_unknown(payload, _PAYLOAD_KEYS),
    )
    unknown = list(cp.unknown)
    for rec in cp.claims.values():
        unknown += [f"claims.{rec.uid}.{k}" for k in rec.unknown]
        unknown += [f"claims.{rec.uid}.{d.device}.{k}" for d in rec.devices for k in d.unknown]
    if unknown:
        notes.append(f"kept fields this release does not know: {', '.join(sorted(unknown))}")
    return cp, notes


# -- files -----------------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    """Makes a rename in `directory` durable. The rename has happened either way, so a
    failure here is logged, not raised: the caller must not undo a visible write."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not fsync directory", path=str(directory), error=str(exc))


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replaces `path` with `data` so that a reader (or the file after a crash or power
    loss) sees either the old content or the new, never a mix. The temp file is a dot
    file ending in .tmp in the same directory (a rename cannot cross filesystems, and
    CDI scanners only read *.json and *.yaml); it is removed if anything fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def remove_stale_temps(path: Path, older_than: float = _STALE_TEMP_SECONDS) -> list[Path]:
    """Deletes temp files of atomic_write(path) left behind by a crash."""
    removed = []
    cutoff = time.time() - older_than
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed.append(tmp)
    return removed


class CheckpointStore:
    """Load and save the checkpoint file. Call both under the node's FileLock."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id

    def _empty(self) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id, running_boot_id=self.boot_id)

    def load(self) -> Checkpoint:
        """The checkpoint on disk; empty if there is none or it cannot be trusted. Never
        raises for the file's content: a crash here would crash-loop the plugin."""
        for tmp in remove_stale_temps(self.path):
            log.warning("removed a temp file left by an interrupted write", path=str(tmp))
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return self._empty()
        except OSError as exc:
            return self._quarantine(f"unreadable: {exc}")
        try:
            cp, notes = parse_checkpoint(data)
        except CheckpointCorrupt as exc:
            return self._quarantine(str(exc))
        for note in notes:
            log.warning("checkpoint: " + note, path=str(self.path), version=cp.version)
        cp.running_boot_id = self.boot_id
        return cp

    def _quarantine(self, reason: str) -> Checkpoint:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.rename(self.path, target)
            fsync_dir(self.path.parent)
            moved = str(target)
        except OSError as exc:
            moved = f"(could not move it: {exc}; the next save overwrites it)"
        log.error(
            "CHECKPOINT CORRUPT: starting with an empty state; claims recorded in it are "
            "forgotten and devices they used may need cleaning up by hand",
            path=str(self.path),
            reason=reason,
            moved_to=moved,
        )
        return self._empty()

    def save(self, cp: Checkpoint) -> None:
        """Writes `cp` atomically in the current format. The stored boot ID becomes this
        boot's (the file describes what this boot's plugin knows), also in `cp`; so
        reconcile a new boot before the first save. Raises OSError (disk full, read-only
        state dir) with the old file intact."""
        if self.boot_id:
            cp.boot_id = self.boot_id
        data = encode_checkpoint(cp)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, data, mode=0o600)
        cp.version = CURRENT_VERSION
        cp.running_boot_id = self.boot_id


# -- boot handling ---------------------------------------------------------------------------


def current_boot_id(path: str | Path = BOOT_ID_PATH) -> str:
    """This boot's random ID, or "" (with a warning) if it cannot be read; "" makes
    reconcile_boot assume the worst of both cases."""
    try:
        boot_id = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning(
            "cannot read the boot ID; reboots will not be detected", path=str(path), error=str(exc)
        )
        return ""
    if not boot_id:
        log.warning("the boot ID is empty; reboots will not be detected", path=str(path))
    return boot_id


@dataclass
class BootReconciliation:
    checkpoint: Checkpoint  # to save: dropped claims removed, boot ID updated
    rebooted: bool | None  # None: no current boot ID, so nobody can tell
    # Rebooted mid-prepare: removed from the checkpoint; the caller cleans up anything
    # that outlived the reboot (files in /etc, MIG devices on drivers that keep them).
    dropped: list[ClaimRecord] = field(default_factory=list)
    # Rebooted, prepared: still valid, but their CDI specs in /var/run/cdi are gone and
    # must be rewritten (and their devices checked) before the kubelet asks again.
    recheck: list[ClaimRecord] = field(default_factory=list)
    # Same boot, mid-prepare: a crash interrupted them; the caller rolls them back and
    # then removes them. Still in the checkpoint.
    interrupted: list[ClaimRecord] = field(default_factory=list)


def reconcile_boot(cp: Checkpoint, boot_id: str | None = None) -> BootReconciliation:
    """What a (re)start must do about the claims in `cp`, given the running boot ID
    (`boot_id`, else the one CheckpointStore.load recorded). Does not modify `cp`."""
    current = boot_id if boot_id is not None else (cp.running_boot_id or "")
    started = [r for r in cp.claims.values() if r.state != PREPARE_COMPLETED]
    completed = [r for r in cp.claims.values() if r.state == PREPARE_COMPLETED]
    if not current:
        # Unknown: undo unfinished prepares (safe whether or not we rebooted) and rewrite
        # the specs of finished ones (idempotent), keeping the stored boot ID.
        out = dataclasses.replace(cp, claims=dict(cp.claims))
        return BootReconciliation(out, None, recheck=completed, interrupted=started)
    if cp.boot_id == current:
        out = dataclasses.replace(cp, claims=dict(cp.claims), running_boot_id=current)
        return BootReconciliation(out, False, interrupted=started)
    kept = {uid: r for uid, r in cp.claims.items() if r.state == PREPARE_COMPLETED}
    out = dataclasses.replace(cp, boot_id=current, claims=kept, running_boot_id=current)
    return BootReconciliation(out, True, dropped=started, recheck=completed)


# -- locking ---------------------------------------------------------------------------------


class LockTimeout(TimeoutError):
    """Another holder kept the lock for longer than the timeout."""


class FileLock:
    """An exclusive flock(2) on `path`, shared by every plugin instance on the node.

    The kernel drops the lock when its holder dies, so a crash never leaves the node
    locked. Reusable (enter it as often as needed) and safe to share between threads,
    but not reentrant: entering it again in the thread that holds it deadlocks (or
    times out).
    """

    def __init__(self, path: Path, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        # flock excludes other open files, hence other processes and other FileLock
        # objects; this excludes threads sharing this object (and its one fd slot).
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None) -> None:
        """Blocks until held; with a timeout (seconds; else the constructor's) raises
        LockTimeout once it has passed."""
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise LockTimeout(
                f"timed out after {timeout}s waiting for the lock {self.path} "
                "(held in this process: by another thread, or by this one, as it is not reentrant)"
            )
        try:
            self._fd = self._lock_file(deadline, timeout)
        except BaseException:
            self._thread_lock.release()
            raise

    def _lock_file(self, deadline: float | None, timeout: float | None) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                delay = 0.001
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise LockTimeout(
                                f"timed out after {timeout}s waiting for the lock "
                                f"{self.path}, held by {self._holder()}"
                            ) from None
                        time.sleep(min(delay, remaining))
                        delay = min(delay * 2, 0.05)
            # Who holds it, for the next waiter's timeout message.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "an unknown process"
        except OSError:
            return "an unknown process"

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError(f"lock {self.path} released but not held")
        try:
            # Closing drops the flock; the holder note stays, harmlessly stale.
            os.close(fd)
        finally:
            self._thread_lock.release()

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
