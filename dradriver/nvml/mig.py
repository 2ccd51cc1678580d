"""Carving MIG devices through NVML: create a GPU instance at a placement and its full
compute instance, destroy them in the right order, switch MIG mode where the product
allows it. Every call goes through the pynvml API, so the fake and a real GPU run the
same code. Callers record intent before calling and handle rollback; this module only
guarantees that a failing `create` leaves nothing of its own behind.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dradriver import errors
from dradriver.crashpoints import crashpoint
from dradriver.logs import get_logger

log = get_logger("nvml.mig")

# Compute-instance profile index (NVML_COMPUTE_INSTANCE_PROFILE_*) for a GPU instance
# of this many compute slices: a MIG device is a GI with one CI that takes it whole.
CI_PROFILE_FOR_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


class MigNvmlError(errors.MigError):
    """An NVML failure while carving or destroying, with the step and the NVML error."""

    def __init__(self, step: str, err: Exception, *, in_use: bool = False) -> None:
        super().__init__(f"{step}: {type(err).__name__}: {err}", in_use=in_use)
        self.step = step


@dataclass(frozen=True)
class Created:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str


@dataclass(frozen=True)
class Instance:
    """A GPU instance as NVML reports it now."""

    gpu_uuid: str
    gpu_instance_id: int
    profile_id: int
    placement_start: int
    compute_instance_ids: tuple[int, ...]


class MigCarver:
    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml

    def _h(self, gpu_uuid: str) -> Any:
        try:
            return self.nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except self.nvml.NVMLError as err:
            raise MigNvmlError(f"looking up GPU {gpu_uuid}", err) from err

    def mig_enabled(self, gpu_uuid: str) -> bool:
        h = self._h(gpu_uuid)
        try:
            current, _ = self.nvml.nvmlDeviceGetMigMode(h)
        except self.nvml.NVMLError as err:
            raise MigNvmlError(f"reading the MIG mode of {gpu_uuid}", err) from err
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def set_mig_mode(self, gpu_uuid: str, enable: bool) -> None:
        nvml = self.nvml
        mode = nvml.NVML_DEVICE_MIG_ENABLE if enable else nvml.NVML_DEVICE_MIG_DISABLE
        step = f"{'enabling' if enable else 'disabling'} MIG mode on {gpu_uuid}"
        h = self._h(gpu_uuid)
        try:
            nvml.nvmlDeviceSetMigMode(h, mode)
        except nvml.NVMLError as err:
            if isinstance(err, nvml.NVMLError_InUse):
                step += f" (the GPU is in use by {self.holders(h)})"
            raise MigNvmlError(step, err, in_use=isinstance(err, nvml.NVMLError_InUse)) from err
        if self.mig_enabled(gpu_uuid) != enable:
            # Ampere: the change waits for a GPU reset. Publishing never offers partitions
            # of such GPUs, so getting here means the hardware changed under us.
            raise MigNvmlError(step, RuntimeError("the new mode needs a GPU reset"))

    def holders(self, h: Any) -> str:
        """Who keeps a GPU busy, for the message when its MIG mode cannot change: CUDA
        processes by PID and name, else the usual holders of a bare handle."""
        nvml = self.nvml
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
        except Exception:  # diagnostics only: any failure just means "not known"
            procs = []
        names = []
        for p in procs or []:
            try:
                comm = Path(f"/proc/{p.pid}/comm").read_text().strip()
            except OSError:
                comm = "?"
            names.append(f"{comm} (pid {p.pid})")
        if names:
            return "CUDA processes " + ", ".join(names) + "; stop them and retry"
        return (
            "a process that holds it without computing, usually a monitoring agent such as "
            "DCGM, dcgm-exporter or nvidia-smi in a loop; stop it, or set MIG mode yourself "
            "and run the plugin with --mig-mode-switching=never"
        )

    def create(
        self, gpu_uuid: str, profile_id: int, start: int, *, size: int, compute_slices: int
    ) -> Created:
        nvml = self.nvml
        h = self._h(gpu_uuid)
        where = f"GPU {gpu_uuid} profile {profile_id} placement {start}"
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        try:
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                h, profile_id, ctypes.byref(placement)
            )
        except nvml.NVMLError as err:
            raise MigNvmlError(f"creating the GPU instance ({where})", err) from err
        crashpoint("mig-gi-created")  # the GPU instance exists, known only by its placement
        try:
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                CI_PROFILE_FOR_SLICES[compute_slices],
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
        except nvml.NVMLError as err:
            # A GPU instance without a compute instance is no usable device: never leave one.
            self._destroy_gi_quietly(gi, where)
            raise MigNvmlError(f"creating the compute instance ({where})", err) from err
        crashpoint("mig-ci-created")
        try:
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
            uuid = self._mig_uuid(h, gi_id, ci_id)
        except (nvml.NVMLError, LookupError) as err:
            try:
                nvml.nvmlComputeInstanceDestroy(ci)
            except nvml.NVMLError as e2:
                log.error(
                    "rollback: destroying the compute instance failed", gpu=gpu_uuid, error=str(e2)
                )
            self._destroy_gi_quietly(gi, where)
            raise MigNvmlError(f"reading the new MIG device ({where})", err) from err
        return Created(gi_id, ci_id, uuid)

    def adopt(self, gpu_uuid: str, gi_id: int, profile_id: int) -> Created | None:
        """The MIG device of an existing GPU instance (its first compute instance), or
        None when the GPU instance or its compute instance is gone."""
        h = self._h(gpu_uuid)
        try:
            found = self._instances(gpu_uuid, [profile_id])
        except self.nvml.NVMLError:
            return None
        inst = next((i for i in found if i.gpu_instance_id == gi_id), None)
        if inst is None or not inst.compute_instance_ids:
            return None
        ci_id = inst.compute_instance_ids[0]
        try:
            return Created(gi_id, ci_id, self._mig_uuid(h, gi_id, ci_id))
        except (self.nvml.NVMLError, LookupError):
            return None

    def _mig_uuid(self, h: Any, gi_id: int, ci_id: int) -> str:
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nvml.NVMLError_NotFound:
                continue
            if (
                nvml.nvmlDeviceGetGpuInstanceId(mh) == gi_id
                and nvml.nvmlDeviceGetComputeInstanceId(mh) == ci_id
            ):
                return str(nvml.nvmlDeviceGetUUID(mh))
        raise LookupError(f"no MIG device with GPU instance {gi_id} and compute instance {ci_id}")

    def _destroy_gi_quietly(self, gi: Any, where: str) -> None:
        try:
            self.nvml.nvmlGpuInstanceDestroy(gi)
        except self.nvml.NVMLError as err:
            log.error("rollback: destroying the GPU instance failed", where=where, error=str(err))

    def destroy(self, gpu_uuid: str, gpu_instance_id: int, compute_instance_id: int | None) -> None:
        """Compute instance first, then the GPU instance. Already gone counts as done."""
        nvml = self.nvml
        where = f"GPU {gpu_uuid} GPU instance {gpu_instance_id}"
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except nvml.NVMLError_GpuIsLost:
            # Off the bus: nothing can be destroyed on it now, and its GPU instances go
            # with the reset that brings it back (they do not survive one). Waiting for it
            # would keep the claim's pods terminating forever.
            log.warning("GPU off the bus: its MIG device goes with its reset", where=where)
            return
        except nvml.NVMLError as err:
            raise MigNvmlError(f"looking up GPU {gpu_uuid}", err) from err
        try:
            gi = nvml.nvmlDeviceGetGpuInstanceById(h, gpu_instance_id)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            return
        except nvml.NVMLError as err:
            raise MigNvmlError(f"looking up {where}", err) from err
        cis = [compute_instance_id] if compute_instance_id is not None else []
        cis += [c for c in self._ci_ids(gi) if c not in cis]
        for ci_id in cis:
            try:
                ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                nvml.nvmlComputeInstanceDestroy(ci)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue
            except nvml.NVMLError as err:
                raise MigNvmlError(
                    f"destroying compute instance {ci_id} of {where}",
                    err,
                    in_use=isinstance(err, nvml.NVMLError_InUse),
                ) from err
        try:
            nvml.nvmlGpuInstanceDestroy(gi)
        except nvml.NVMLError_NotFound:
            return
        except nvml.NVMLError as err:
            raise MigNvmlError(
                f"destroying {where}", err, in_use=isinstance(err, nvml.NVMLError_InUse)
            ) from err

    def _ci_ids(self, gi: Any) -> list[int]:
        nvml = self.nvml
        out: list[int] = []
        for index in CI_PROFILE_FOR_SLICES.values():
            try:
                prof = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nvml.NVMLError:
                continue
            arr = (nvml.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(8)
            try:
                nvml.nvmlGpuInstanceGetComputeInstances(gi, prof.id, arr, ctypes.byref(count))
            except nvml.NVMLError:
                continue
            out += [int(nvml.nvmlComputeInstanceGetInfo(arr[i]).id) for i in range(count.value)]
        return out

    def instances(self, gpu_uuid: str, profile_ids: list[int]) -> list[Instance]:
        """Every GPU instance on the GPU (of the given profiles), with its compute instances."""
        try:
            return self._instances(gpu_uuid, profile_ids)
        except self.nvml.NVMLError as err:
            raise MigNvmlError(f"listing the MIG devices of {gpu_uuid}", err) from err

    def _instances(self, gpu_uuid: str, profile_ids: list[int]) -> list[Instance]:
        nvml = self.nvml
        h = self._h(gpu_uuid)
        out: list[Instance] = []
        for pid in profile_ids:
            arr = (nvml.c_nvmlGpuInstance_t * 8)()
            count = ctypes.c_uint(8)
            try:
                nvml.nvmlDeviceGetGpuInstances(h, pid, arr, ctypes.byref(count))
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            for i in range(count.value):
                info = nvml.nvmlGpuInstanceGetInfo(arr[i])
                out.append(
                    Instance(
                        gpu_uuid,
                        int(info.id),
                        int(info.profileId),
                        int(info.placement.start),
                        tuple(self._ci_ids(arr[i])),
                    )
                )
        return sorted(out, key=lambda x: x.placement_start)


def _access(path: Path) -> tuple[int, int | None]:
    """(DeviceFileMinor, DeviceFileMode) of a capability's access file."""
    minor, mode = None, None
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            minor = int(value.strip())
        elif key.strip() == "DeviceFileMode":
            mode = int(value.strip())
    if minor is None:
        raise ValueError(f"{path}: no DeviceFileMinor line")
    return minor, mode


def caps_device_minors(
    proc_root: Path, gpu_minor: int, gi_id: int, *, ci_id: int
) -> tuple[int, int]:
    """The /dev/nvidia-caps/nvidia-cap<N> minors a container needs for one MIG device,
    read from /proc/driver/nvidia/capabilities (lines like "DeviceFileMinor: 46")."""
    gi, ci = caps_access(proc_root, gpu_minor, gi_id, ci_id=ci_id)
    return gi[0], ci[0]


def caps_access(
    proc_root: Path, gpu_minor: int, gi_id: int, *, ci_id: int
) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
    """(minor, file mode) of the GPU instance's and the compute instance's capability."""
    base = proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_minor}" / "mig"
    return _access(base / f"gi{gi_id}" / "access"), _access(
        base / f"gi{gi_id}" / f"ci{ci_id}" / "access"
    )


def caps_major(proc_root: Path) -> int | None:
    """The character-device major of nvidia-caps, or None where the driver registered none."""
    return device_major(proc_root, "nvidia-caps")


def device_major(proc_root: Path, name: str) -> int | None:
    """A character device's major number (dynamic: its line of /proc/devices)."""
    try:
        lines = (proc_root / "devices").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None
