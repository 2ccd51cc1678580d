"""A cgroup's GPU-memory limit on one GPU through NVML (r615+: nvmlDeviceSetMemoryLimits_v1,
nvmlDeviceGetMemoryLimits_v1), the kernel-enforced bound NVIDIA documents as "MPS v3 memory
partitioning": the hard limit is the cgroup's dmem.max for the GPU's region (an allocation
past it fails with out-of-memory), the soft limit its dmem.min (memory guaranteed to it).
On kernels without the dmem controller the driver keeps the limit itself (NVIDIA's "misc"
backend); NVML hides which. Whole GPUs only: MIG handles are not supported. Root only.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from dradriver.errors import SharingError


@dataclass(frozen=True)
class MemoryLimit:
    soft: int  # bytes; 0: none
    hard: int | None  # bytes; None: no limit (NVML_DEVICE_MEMORY_LIMIT_MAX)
    used: int  # what the cgroup's processes hold on the GPU now


def _handle(nvml: ModuleType, uuid: str) -> object:
    return nvml.nvmlDeviceGetHandleByUUID(uuid)


def set_memory_limit(nvml: ModuleType, uuid: str, cgroup: str, *, soft: int, hard: int) -> None:
    """Limits what the processes of `cgroup` (its full path under the cgroup v2 mount) may
    allocate on GPU `uuid`; raises SharingError (reason names the NVML return)."""
    try:
        limits = nvml.c_nvmlSetMemoryLimits_v1_t(
            nameSpace=cgroup.encode(), softLimit=soft, hardLimit=hard
        )
        nvml.nvmlDeviceSetMemoryLimits_v1(_handle(nvml, uuid), limits)
    except nvml.NVMLError as err:
        raise SharingError(
            f"setting the GPU-memory limit of cgroup {cgroup} on {uuid}: {err}",
            reason=_reason(nvml, err),
        ) from err


def get_memory_limit(nvml: ModuleType, uuid: str, cgroup: str) -> MemoryLimit:
    try:
        limits = nvml.c_nvmlGetMemoryLimits_v1_t(nameSpace=cgroup.encode())
        nvml.nvmlDeviceGetMemoryLimits_v1(_handle(nvml, uuid), limits)
    except nvml.NVMLError as err:
        raise SharingError(
            f"reading the GPU-memory limit of cgroup {cgroup} on {uuid}: {err}",
            reason=_reason(nvml, err),
        ) from err
    hard = int(limits.hardLimit)
    return MemoryLimit(
        int(limits.softLimit),
        None if hard >= int(nvml.NVML_DEVICE_MEMORY_LIMIT_MAX) else hard,
        int(limits.currentUsed),
    )


def _reason(nvml: ModuleType, err: Exception) -> str:
    code = getattr(err, "value", None)
    return {
        getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1): "memory_limits_missing",
        getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", -1): "memory_limits_unsupported",
        getattr(nvml, "NVML_ERROR_NO_PERMISSION", -1): "memory_limits_permission",
        getattr(nvml, "NVML_ERROR_NOT_FOUND", -1): "cgroup_not_found",
    }.get(code, "memory_limits")
