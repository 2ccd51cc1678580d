"""Emulated C functions: a cgroup's GPU-memory limits (nvmlDeviceSetMemoryLimits_v1,
nvmlDeviceGetMemoryLimits_v1), as NVIDIA's NVML reference and its "MPS v3 Memory
Partitioning" page describe them, on the dmem model of fakenvml.dmem:

- r615 and newer only (older drivers lack the symbols: FUNCTION_NOT_FOUND).
- Whole GPUs: a MIG handle gets NOT_SUPPORTED ("MIG handles are not supported").
- Setting needs root: NO_PERMISSION otherwise ("Requires root/admin permissions").
- nameSpace is the cgroup's full path; a path that is not a directory: NOT_FOUND (assumed:
  NVIDIA documents no code for it).
- cgroup v2 with the GPU's region registered in the hierarchy's dmem.capacity, else
  NOT_SUPPORTED. The fake refuses the host's own /sys/fs/cgroup the same way: it models
  the limits on a test's tree and never writes a real cgroup.
- Hard limit -> dmem.max, soft limit -> dmem.min; soft 0 and hard
  NVML_DEVICE_MEMORY_LIMIT_MAX clear them; a soft limit above the hard one:
  INVALID_ARGUMENT (assumed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pynvml

from fakenvml import cmem, dmem, returns
from fakenvml.context import CallContext, Registry
from fakenvml.machine import FakeGpu
from fakenvml.returns import NvmlReturn

C = Registry()
FROM_DRIVER = 615  # NVIDIA: memory partitioning needs driver r615 (CUDA 13.4)
MAX = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


def _where(ctx: CallContext, handle: object, limits: object) -> tuple[FakeGpu, Path, str]:
    major = ctx.machine.driver_version.split(".", 1)[0]
    if not major.isdigit() or int(major) < FROM_DRIVER:
        raise NvmlReturn(returns.FUNCTION_NOT_FOUND, f"driver {ctx.machine.driver_version}")
    gpu = ctx.device(handle)  # a MIG handle: NOT_SUPPORTED
    raw = cmem.target(limits).nameSpace  # pynvml's structures hand c_char_p out as str
    path = Path(raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or ""))
    if not path.is_absolute() or not path.is_dir():
        raise NvmlReturn(returns.NOT_FOUND, f"no cgroup {path}")
    resolved = path.resolve()
    if resolved == dmem.HOST_CGROUPS or dmem.HOST_CGROUPS in resolved.parents:
        raise NvmlReturn(returns.NOT_SUPPORTED, "the fake never touches the host's cgroups")
    root = dmem.hierarchy_root(path)
    name = dmem.region(gpu.layout.pci.legacy_bus_id)
    if root is None or name not in dmem.capacity(root):
        raise NvmlReturn(returns.NOT_SUPPORTED, f"no dmem region {name} registered")
    return gpu, path, name


@C.emulates("nvmlDeviceSetMemoryLimits_v1")
def set_memory_limits(ctx: CallContext, handle: object, limits: object) -> None:
    _, path, name = _where(ctx, handle, limits)
    if os.geteuid() != 0:
        raise NvmlReturn(returns.NO_PERMISSION, "setting memory limits requires root")
    want = cmem.target(limits)
    soft, hard = int(want.softLimit), int(want.hardLimit)
    if soft > hard:
        raise NvmlReturn(returns.INVALID_ARGUMENT, "soft limit above the hard limit")
    dmem.set_limits(path, name, soft, None if hard >= MAX else hard)


@C.emulates("nvmlDeviceGetMemoryLimits_v1")
def get_memory_limits(ctx: CallContext, handle: object, limits: object) -> None:
    _, path, name = _where(ctx, handle, limits)
    soft, hard, used = dmem.limits(path, name)
    cmem.fill(
        cmem.target(limits),
        softLimit=soft,
        hardLimit=MAX if hard is None else hard,
        currentUsed=used,
    )
