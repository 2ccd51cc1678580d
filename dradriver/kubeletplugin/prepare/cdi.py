"""One CDI spec per prepared claim: what the container runtime injects for its devices
(kind `<driver>/claim`, each device `<device>-<claim uid>`, cdiVersion 0.3.0, each device
carrying its group's UUIDs), and the writer of the specs. Why each: docs/design.md,
"CDI specs".
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dradriver.errors import CdiError
from dradriver.kubeletplugin.state.files import atomic_write
from dradriver.nvml.host import DeviceNode

CLAIM_CLASS: Final = "claim"
# The node's driver spec (driver_spec): one device whose spec carries the driver's files.
DRIVER_CLASS: Final = "driver"
DRIVER_DEVICE: Final = "files"
# Ascending; what cdi_version_for can return.
CDI_VERSIONS: Final = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "1.1.0")

# A CDI vendor (the driver name) must start with a letter, end with a letter or digit and
# hold only letters, digits, "-", "_" and "."; a DNS subdomain starting with a letter is
# that and also what Kubernetes requires of a driver name.
_DRIVER = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Kubernetes UIDs are UUIDs. Letters, digits and inner dashes keep a UID from escaping the
# spec directory and keep `<device>-<uid>` a valid CDI device name (which must end in a
# letter or digit).
_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,126}[A-Za-z0-9])?")
# The CDI library's device-name rule.
_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[^A-Z0-9_]")


@functools.cache  # pure; once per driver name, not once per spec
def _check_driver(driver: str) -> None:
    if len(driver) > 63 or not _DRIVER.fullmatch(driver):
        raise ValueError(
            f"CDI: driver name {driver!r} is not a DNS subdomain starting with a letter"
        )


def _check_uid(claim_uid: str) -> None:
    if not _UID.fullmatch(claim_uid):
        raise ValueError(
            f"CDI: claim UID {claim_uid!r} is not a Kubernetes UID (letters, "
            "digits and inner dashes only)"
        )


# -- pure part -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CdiDevice:
    """One prepared device as the container should see it."""

    name: str  # the DRA device name: gpu-9b3c2810, gpu-9b3c2810-mig-1g10gb-0
    uuid: str  # GPU-... or MIG-...
    # The /dev nodes of this device (/dev/nvidia<minor>, MIG /dev/nvidia-caps/...), as the
    # node's GpuHost names them; none where no such nodes exist (fake GPUs). A node of a
    # path alone is one the runtime copies from the host.
    device_nodes: Sequence[DeviceNode] = ()
    # Further "KEY=VALUE" variables (sharing setup such as MPS pipe directories).
    env: Sequence[str] = ()
    # Host directories bind-mounted into the container, as (host path, container path,
    # "rw" or "ro"): the MPS pipe and log directories, and the daemon's /dev/shm.
    mounts: Sequence[tuple[str, str, str]] = ()
    # Devices handed to a container together (one request; "" = the whole claim) share a
    # UUID list; see docs/design.md, "CDI specs".
    group: str = ""
    # The DRA device, where the CDI name is not it (a share: gpu-9b3c2810-share-<shareID>):
    # DRADRIVER_DEVICE_<NAME> names the device either way.
    device: str = ""
    # Not a GPU (an IMEX channel): no UUID, and nothing of the GPUs' visibility, which the
    # container's GPU claims set.
    gpu: bool = True


def qualified_name(driver: str, device: str, claim_uid: str) -> str:
    """The CDI device ID the kubelet passes to the runtime:
    gpu.dradriver.io/claim=gpu-9b3c2810-<uid>."""
    return f"{driver}/{CLAIM_CLASS}={device}-{claim_uid}"


def claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[CdiDevice],
    *,
    claim_name: str,
    control_nodes: Sequence[DeviceNode] = (),
) -> dict[str, Any]:
    """The CDI spec for one claim. `claim_name` is "<namespace>/<name>"; `control_nodes`
    are the /dev nodes every GPU container needs (nvidiactl, uvm).

    NVIDIA_VISIBLE_DEVICES is always set (it overrides an image's "all", which a legacy
    nvidia runtime hook would honour). CUDA_VISIBLE_DEVICES is set only for a device
    without device nodes: nodes already bound what CUDA sees, and the value of the last
    claim applied would hide the other claims' GPUs from a container using two claims.

    Raises ValueError for input that would make an invalid spec.
    """
    _check_driver(driver)
    _check_uid(claim_uid)
    if not devices:
        raise ValueError(f"CDI: claim {claim_uid} has no devices (a spec needs at least one)")
    seen: set[str] = set()
    groups: dict[str, list[str]] = {}
    entries: list[dict[str, Any]] = []
    for dev in devices:
        _check_device(dev, seen)
        env: list[str] = []
        if dev.gpu:
            uuids = groups.setdefault(dev.group, [])
            uuids.append(dev.uuid)
            visible = ",".join(uuids)
            env.append(f"NVIDIA_VISIBLE_DEVICES={visible}")
            if not dev.device_nodes:
                env.append(f"CUDA_VISIBLE_DEVICES={visible}")
            # DRADRIVER_DEVICE_GPU_9B3C2810 for gpu-9b3c2810: unique per device, as
            # device names are DNS labels.
            named = "DRADRIVER_DEVICE_" + _ENV_NAME.sub("_", (dev.device or dev.name).upper())
            env.append(f"{named}={dev.uuid}")
        edits: dict[str, Any] = {"env": [*env, *dev.env]}
        if dev.mounts:
            edits["mounts"] = [
                {"hostPath": h, "containerPath": c, "options": [mode, "bind"]}
                for h, c, mode in dev.mounts
            ]
        if dev.device_nodes:
            edits["deviceNodes"] = [_node(n) for n in dev.device_nodes]
        entries.append({"name": f"{dev.name}-{claim_uid}", "containerEdits": edits})
    top: dict[str, Any] = {
        "env": [f"DRADRIVER_CLAIM={claim_name}", f"DRADRIVER_CLAIM_UID={claim_uid}"]
    }
    if control_nodes and any(d.gpu for d in devices):
        top["deviceNodes"] = [_node(n) for n in control_nodes]
    return _versioned(
        {"kind": f"{driver}/{CLAIM_CLASS}", "devices": entries, "containerEdits": top}
    )


def driver_device_id(driver: str) -> str:
    """gpu.dradriver.io/driver=files: the ID every GPU device of a claim also names, so a
    container gets the driver's files once however many claims and devices it uses."""
    return f"{driver}/{DRIVER_CLASS}={DRIVER_DEVICE}"


def driver_spec(driver: str, version: str, edits: Mapping[str, Any]) -> dict[str, Any]:
    """The node's driver spec: `edits` (what NVIDIA's container toolkit says a container
    needs of driver `version`: libraries, commands, firmware, hooks) as the spec's own
    edits, which the CDI library applies once per container whichever of the spec's
    devices it is given, and once only when several claims name it. The toolkit's
    NVIDIA_VISIBLE_DEVICES=void is left out: each claim's devices say which GPUs."""
    _check_driver(driver)
    if not version or any(c in version for c in ", \t\n="):
        raise ValueError(f"CDI: driver version {version!r} is not one")
    top = {k: v for k, v in edits.items() if v}
    env = [e for e in top.pop("env", []) if not str(e).startswith("NVIDIA_VISIBLE_DEVICES=")]
    if env:
        top["env"] = env
    # A device needs edits of its own; this one says which driver it is.
    own = {"env": [f"DRADRIVER_DRIVER_VERSION={version}"]}
    device = {"name": DRIVER_DEVICE, "containerEdits": own}
    return _versioned(
        {"kind": f"{driver}/{DRIVER_CLASS}", "devices": [device], "containerEdits": top}
    )


def _versioned(spec: dict[str, Any]) -> dict[str, Any]:
    return {"cdiVersion": cdi_version_for(spec), **spec}


def _node(node: DeviceNode) -> dict[str, Any]:
    # A node's type, major and minor are all set or none is.
    out = {"path": node.path, "type": node.type, "major": node.major, "minor": node.minor}
    return {k: v for k, v in {**out, "fileMode": node.file_mode}.items() if v is not None}


def _check_device(dev: CdiDevice, seen: set[str]) -> None:
    if not _DEVICE.fullmatch(dev.name):
        raise ValueError(f"CDI: device name {dev.name!r} is not a valid CDI device name")
    if dev.name in seen:
        raise ValueError(f"CDI: device {dev.name} listed twice")
    seen.add(dev.name)
    # A UUID goes into comma-separated lists and env values.
    if dev.gpu and (not dev.uuid or any(c in dev.uuid for c in ", \t\n=")):
        raise ValueError(f"CDI: device {dev.name} has no usable UUID ({dev.uuid!r})")
    for kv in dev.env:
        if kv.find("=") <= 0:
            raise ValueError(f"CDI: device {dev.name}: env entry {kv!r} is not KEY=VALUE")
    for n in dev.device_nodes:
        if not n.path.startswith("/"):
            raise ValueError(
                f"CDI: device {dev.name}: device node {n.path!r} is not an absolute path"
            )


def cdi_version_for(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion that can express `spec`, by the CDI library's rules: runtimes
    reject a spec whose version is too low, and older runtimes one that is too high."""
    devices: list[Mapping[str, Any]] = list(spec.get("devices") or [])
    edits = [d.get("containerEdits") or {} for d in devices] + [spec.get("containerEdits") or {}]
    rdts = [e["intelRdt"] for e in edits if e.get("intelRdt") is not None]
    rdt_110 = any(r.get("schemata") is not None or r.get("enableMonitoring") for r in rdts)
    if rdt_110 or any(e.get("netDevices") for e in edits):
        return "1.1.0"
    if rdts or any(e.get("additionalGids") for e in edits):
        return "0.7.0"
    annotated = spec.get("annotations") or any(d.get("annotations") for d in devices)
    if annotated or "." in str(spec.get("kind", "")).partition("/")[2]:
        return "0.6.0"
    digit_named = any(re.match("[0-9]", str(d.get("name") or "")) for d in devices)
    host_path = any(n and n.get("hostPath") for e in edits for n in e.get("deviceNodes") or [])
    if digit_named or host_path:
        return "0.5.0"
    if any(m and m.get("type") for e in edits for m in e.get("mounts") or []):
        return "0.4.0"
    return CDI_VERSIONS[0]


# -- edge: the spec directory ----------------------------------------------------------------


class CdiWriteError(CdiError):
    """A spec could not be written; the message names the CDI layer, claim and path."""

    def __init__(self, errno: int | None, message: str) -> None:
        super().__init__(message, reason="cdi")
        self.errno = errno


class CdiWriter:
    """Writes and removes this driver's claim specs in `cdi_dir` (/var/run/cdi)."""

    def __init__(self, cdi_dir: Path, driver: str) -> None:
        _check_driver(driver)
        self.cdi_dir = Path(cdi_dir)
        self.driver = driver
        self._prefix = f"{self.cdi_dir}/{driver}-{CLAIM_CLASS}-"
        self._spec_name = re.compile(
            re.escape(f"{driver}-{CLAIM_CLASS}-") + rf"({_UID.pattern})\.json"
        )

    def spec_path(self, claim_uid: str) -> Path:
        """<cdi_dir>/<driver>-claim-<uid>.json; ValueError for a UID that is not one."""
        return Path(self._file(claim_uid))

    def _file(self, claim_uid: str) -> str:
        # A string, not a Path: pathlib's parsing was a tenth of a spec's write. _UID
        # admits no "/" and no ".", so the name cannot leave cdi_dir.
        _check_uid(claim_uid)
        return f"{self._prefix}{claim_uid}.json"

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> None:
        """Atomically writes the claim's spec (a runtime never reads half a file) to
        spec_path(claim_uid). Raises CdiWriteError (an OSError) on failure, with no temp
        file left behind."""
        path = self._file(claim_uid)
        self._put(path, spec, f"the spec of claim {claim_uid} to {path}")

    @property
    def driver_spec_path(self) -> Path:
        return self.cdi_dir / f"{self.driver}-{DRIVER_CLASS}.json"

    def write_driver(self, spec: Mapping[str, Any]) -> None:
        """Atomically writes the node's driver spec (driver_spec)."""
        self._put(str(self.driver_spec_path), spec, f"the driver spec {self.driver_spec_path}")

    def _put(self, path: str, spec: Mapping[str, Any], what: str) -> None:
        # One line: json's C encoder (indenting falls back to its pure-Python one, a tenth
        # of a millisecond of every prepare); `jq .` shows it to a human.
        data = (json.dumps(spec, separators=(",", ":")) + "\n").encode()
        try:
            # Runtimes read specs as root, but 0644 lets node tools inspect them too.
            # Not fsync'd: the checkpoint saved after it is the durable record, and
            # startup rewrites every prepared claim's spec from it, so a spec a power
            # loss emptied (or a reboot wiped from tmpfs) is whole again before any call.
            try:
                atomic_write(path, data, mode=0o644, durable=False)
            except FileNotFoundError:  # no directory yet (or removed): made on demand
                self.cdi_dir.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data, mode=0o644, durable=False)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.ENOSPC:
                reason += f" (the filesystem holding {self.cdi_dir} is full)"
            elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                reason += (
                    f" ({self.cdi_dir} must be writable by the plugin: mount it read-write, "
                    "or point --cdi-dir (Helm cdiDir) at the runtime's CDI directory)"
                )
            raise CdiWriteError(exc.errno, f"CDI layer: cannot write {what}: {reason}") from exc

    def remove_driver(self) -> bool:
        return _unlink(self.driver_spec_path)

    def exists(self, claim_uid: str) -> bool:
        return os.path.isfile(self._file(claim_uid))

    def remove(self, claim_uid: str) -> bool:
        """Removes the claim's spec; False if there was none (unprepare repeats)."""
        return _unlink(self._file(claim_uid))

    def list_claims(self) -> list[str]:
        """UIDs of the claims this driver has a spec file for, to find orphans at startup."""
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return []
        return sorted(m[1] for name in names if (m := self._spec_name.fullmatch(name)))


def _unlink(path: str | Path) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
