"""Emulated C functions: MIG mode, GPU instances, compute instances, MIG device handles.

The rules and their return codes live in machine.py and mig_rules.py. Full-GPU calls made
with a MIG device handle return INVALID_ARGUMENT: NVML wants the parent device there.
"""

from __future__ import annotations

import pynvml

from fakenvml import cmem, mig_rules, returns
from fakenvml.context import CallContext, Registry
from fakenvml.machine import MAX_MIG_DEVICES, FakeGpu, FakeMachine, GpuInstance
from fakenvml.products import CI_PROFILES, ComputeInstanceProfile, GpuInstanceProfile
from fakenvml.returns import NvmlReturn

C = Registry()

_PARENT_ONLY = returns.INVALID_ARGUMENT


def _parent(ctx: CallContext, handle: object) -> FakeGpu:
    gpu = ctx.device(handle, on_mig=_PARENT_ONLY)
    return ctx.machine.mig_gpu(gpu.index)


def _enabled(ctx: CallContext, handle: object) -> FakeGpu:
    gpu = _parent(ctx, handle)
    if not gpu.mig_enabled:
        raise NvmlReturn(returns.NOT_SUPPORTED, "MIG mode is not enabled")
    return gpu


def _gi_profile(gpu: FakeGpu, profile_id: object) -> GpuInstanceProfile:
    p = gpu.layout.product.gi_profile_by_id(cmem.as_int(profile_id))
    if p is None:
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"no GPU instance profile {profile_id}")
    return p


def _write_placements(out: object, count: object, placements: list[tuple[int, int]]) -> None:
    """The `placements` array + `count` output pair; a NULL array asks for the count."""
    if cmem.is_null(count):
        raise NvmlReturn(returns.INVALID_ARGUMENT, "NULL count")
    if not cmem.is_null(out):
        room = cmem.capacity(out)
        # NVML trusts the caller's array size; the fake checks it when ctypes knows it.
        if room is not None and room < len(placements):
            raise NvmlReturn(returns.INSUFFICIENT_SIZE, f"{len(placements)} placements")
        for i, (start, size) in enumerate(placements):
            cmem.write_placement(out, i, start, size)
    cmem.write(count, len(placements))


def _write_handles(out: object, count: object, handles: list[int]) -> None:
    if cmem.is_null(out) or cmem.is_null(count):
        raise NvmlReturn(returns.INVALID_ARGUMENT, "NULL array or count")
    room = cmem.capacity(out)
    if room is not None and room < len(handles):
        raise NvmlReturn(returns.INSUFFICIENT_SIZE, f"{len(handles)} instances")
    for i, h in enumerate(handles):
        cmem.write_handle(out, h, i)
    cmem.write(count, len(handles))


# -- MIG mode and MIG device handles --------------------------------------------------


@C.emulates("nvmlDeviceGetMigMode")
def mig_mode(ctx: CallContext, handle: object, current: object, pending: object) -> None:
    gpu = _parent(ctx, handle)
    cmem.write(current, gpu.mig_current)
    cmem.write(pending, gpu.mig_pending)


@C.emulates("nvmlDeviceSetMigMode")
def set_mig_mode(ctx: CallContext, handle: object, mode: object, activation: object) -> None:
    gpu = _parent(ctx, handle)
    status = ctx.machine.set_mig_mode(gpu.index, cmem.as_int(mode))
    cmem.write(activation, status)


@C.emulates("nvmlDeviceGetMaxMigDeviceCount")
def max_mig_device_count(ctx: CallContext, handle: object, out: object) -> None:
    # Zero, not an error, where MIG is unsupported or disabled.
    gpu = ctx.device(handle, on_mig=_PARENT_ONLY)
    capable = gpu.layout.product.mig_capable
    cmem.write(out, MAX_MIG_DEVICES if capable and gpu.mig_enabled else 0)


@C.emulates("nvmlDeviceGetMigDeviceHandleByIndex")
def mig_device_handle_by_index(
    ctx: CallContext, handle: object, index: object, out: object
) -> None:
    gpu = _enabled(ctx, handle)
    i = cmem.as_int(index)
    if not 0 <= i < MAX_MIG_DEVICES:
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"MIG device index {i}")
    devices = gpu.mig_devices()
    if i >= len(devices):
        raise NvmlReturn(returns.NOT_FOUND, f"no MIG device {i}")
    gi, ci = devices[i]
    cmem.write_handle(out, ctx.mig_handle(gpu.index, gi.id, ci.id))


@C.emulates("nvmlDeviceIsMigDeviceHandle")
def is_mig_device_handle(ctx: CallContext, handle: object, out: object) -> None:
    _, mig = ctx.any_device(handle)
    cmem.write(out, 1 if mig else 0)


@C.emulates("nvmlDeviceGetGpuInstanceId")
def gpu_instance_id(ctx: CallContext, handle: object, out: object) -> None:
    _, mig = ctx.any_device(handle)
    if mig is None:
        raise NvmlReturn(returns.NOT_SUPPORTED, "not a MIG device handle")
    cmem.write(out, mig[0].id)


@C.emulates("nvmlDeviceGetComputeInstanceId")
def compute_instance_id(ctx: CallContext, handle: object, out: object) -> None:
    _, mig = ctx.any_device(handle)
    if mig is None:
        raise NvmlReturn(returns.NOT_SUPPORTED, "not a MIG device handle")
    cmem.write(out, mig[1].id)


@C.emulates("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def parent_handle(ctx: CallContext, handle: object, out: object) -> None:
    gpu, mig = ctx.any_device(handle)
    if mig is None:
        raise NvmlReturn(returns.INVALID_ARGUMENT, "not a MIG device handle")
    cmem.write_handle(out, ctx.device_handle(gpu.index))


# -- GPU instances ------------------------------------------------------------------


def _fill_gi_profile(info: object, p: GpuInstanceProfile, versioned: bool) -> None:
    struct = cmem.target(info)
    if versioned and getattr(struct, "version", None) != pynvml.nvmlGpuInstanceProfileInfo_v2:
        raise NvmlReturn(returns.ARGUMENT_VERSION_MISMATCH, "nvmlGpuInstanceProfileInfo_t")
    cmem.fill(
        struct,
        id=p.id,
        isP2pSupported=0,
        sliceCount=p.compute_slices,
        instanceCount=p.instance_count,
        multiprocessorCount=p.multiprocessors,
        copyEngineCount=p.copy_engines,
        decoderCount=p.decoders,
        encoderCount=p.encoders,
        jpegCount=p.jpegs,
        ofaCount=p.ofas,
        memorySizeMB=p.memory_mib,
        name=f"MIG {p.name}".encode(),
    )


def _gi_profile_by_index(ctx: CallContext, handle: object, index: object) -> GpuInstanceProfile:
    gpu = _parent(ctx, handle)
    i = cmem.as_int(index)
    if not 0 <= i < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"GPU instance profile index {i}")
    p = gpu.layout.product.gi_profile_by_index(i)
    if p is None:
        raise NvmlReturn(returns.NOT_SUPPORTED, f"{gpu.layout.product.key} lacks profile {i}")
    return p


@C.emulates("nvmlDeviceGetGpuInstanceProfileInfo")
def gi_profile_info_v1(ctx: CallContext, handle: object, index: object, info: object) -> None:
    _fill_gi_profile(info, _gi_profile_by_index(ctx, handle, index), versioned=False)


@C.emulates("nvmlDeviceGetGpuInstanceProfileInfoV")
def gi_profile_info(ctx: CallContext, handle: object, index: object, info: object) -> None:
    _fill_gi_profile(info, _gi_profile_by_index(ctx, handle, index), versioned=True)


@C.emulates("nvmlDeviceGetGpuInstanceProfileInfoByIdV")
def gi_profile_info_by_id(ctx: CallContext, handle: object, pid: object, info: object) -> None:
    _fill_gi_profile(info, _gi_profile(_parent(ctx, handle), pid), versioned=True)


@C.emulates("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
def gi_possible_placements(
    ctx: CallContext, handle: object, pid: object, placements: object, count: object
) -> None:
    # Static: every placement of the profile, whatever exists and whatever the MIG mode.
    p = _gi_profile(_parent(ctx, handle), pid)
    _write_placements(placements, count, [(s, p.memory_slices) for s in p.placement_starts])


@C.emulates("nvmlDeviceGetGpuInstanceRemainingCapacity")
def gi_remaining_capacity(ctx: CallContext, handle: object, pid: object, out: object) -> None:
    gpu = _enabled(ctx, handle)
    cmem.write(out, mig_rules.remaining_capacity(gpu.placed(), _gi_profile(gpu, pid)))


@C.emulates("nvmlDeviceCreateGpuInstance")
def create_gi(ctx: CallContext, handle: object, pid: object, out: object) -> None:
    gpu = _parent(ctx, handle)
    gi = ctx.machine.create_gpu_instance(gpu.index, cmem.as_int(pid), None)
    cmem.write_handle(out, ctx.gi_handle(gpu.index, gi.id))


@C.emulates("nvmlDeviceCreateGpuInstanceWithPlacement")
def create_gi_with_placement(
    ctx: CallContext, handle: object, pid: object, placement: object, out: object
) -> None:
    gpu = _parent(ctx, handle)
    start, size = cmem.read_placement(placement)
    gi = ctx.machine.create_gpu_instance(gpu.index, cmem.as_int(pid), start, size)
    cmem.write_handle(out, ctx.gi_handle(gpu.index, gi.id))


@C.emulates("nvmlGpuInstanceDestroy")
def destroy_gi(ctx: CallContext, gi_handle: object) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    ctx.machine.destroy_gpu_instance(gpu.index, gi.id)


@C.emulates("nvmlDeviceGetGpuInstances")
def gpu_instances(
    ctx: CallContext, handle: object, pid: object, out: object, count: object
) -> None:
    gpu = _enabled(ctx, handle)
    p = _gi_profile(gpu, pid)
    found = sorted(gi.id for gi in gpu.gpu_instances.values() if gi.profile.id == p.id)
    _write_handles(out, count, [ctx.gi_handle(gpu.index, i) for i in found])


@C.emulates("nvmlDeviceGetGpuInstanceById")
def gpu_instance_by_id(ctx: CallContext, handle: object, gi_id: object, out: object) -> None:
    gpu = _enabled(ctx, handle)
    i = cmem.as_int(gi_id)
    if i not in gpu.gpu_instances:
        raise NvmlReturn(returns.NOT_FOUND, f"no GPU instance {i}")
    cmem.write_handle(out, ctx.gi_handle(gpu.index, i))


@C.emulates("nvmlGpuInstanceGetInfo")
def gpu_instance_info(ctx: CallContext, gi_handle: object, out: object) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    info = cmem.target(out)
    cmem.set_pointer_field(info, "device", ctx.device_handle(gpu.index))
    info.id = gi.id
    info.profileId = gi.profile.id
    info.placement.start = gi.start
    info.placement.size = gi.profile.memory_slices


# -- compute instances ----------------------------------------------------------------


def _ci_profile(gi: GpuInstance, pid: object, missing: int) -> ComputeInstanceProfile:
    i = cmem.as_int(pid)
    p = FakeMachine.ci_profile(gi, i)
    if p is None:
        code = missing if i in CI_PROFILES else returns.INVALID_ARGUMENT
        raise NvmlReturn(code, f"compute instance profile {i} in {gi.profile.name}")
    return p


def _ci_name(gi: GpuInstance, p: ComputeInstanceProfile) -> str:
    if p.slices == gi.profile.compute_slices:
        return f"MIG {gi.profile.name}"
    return f"MIG {p.slices}c.{gi.profile.name}"


def _fill_ci_profile(
    ctx: CallContext, gi_handle: object, pid: object, engines: object, info: object, versioned: bool
) -> None:
    _, gi = ctx.gpu_instance(gi_handle)
    if cmem.as_int(pid) >= pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"compute instance profile {pid}")
    if cmem.as_int(engines) != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"engine profile {engines}")
    p = _ci_profile(gi, pid, returns.NOT_SUPPORTED)
    struct = cmem.target(info)
    if versioned and getattr(struct, "version", None) != pynvml.nvmlComputeInstanceProfileInfo_v2:
        raise NvmlReturn(returns.ARGUMENT_VERSION_MISMATCH, "nvmlComputeInstanceProfileInfo_t")
    g = gi.profile
    cmem.fill(
        struct,
        id=p.id,
        sliceCount=p.slices,
        instanceCount=g.compute_slices // p.slices,
        multiprocessorCount=g.multiprocessors * p.slices // g.compute_slices,
        sharedCopyEngineCount=g.copy_engines,
        sharedDecoderCount=g.decoders,
        sharedEncoderCount=g.encoders,
        sharedJpegCount=g.jpegs,
        sharedOfaCount=g.ofas,
        name=_ci_name(gi, p).encode(),
    )


@C.emulates("nvmlGpuInstanceGetComputeInstanceProfileInfo")
def ci_profile_info_v1(
    ctx: CallContext, gi_handle: object, pid: object, engines: object, info: object
) -> None:
    _fill_ci_profile(ctx, gi_handle, pid, engines, info, versioned=False)


@C.emulates("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
def ci_profile_info(
    ctx: CallContext, gi_handle: object, pid: object, engines: object, info: object
) -> None:
    _fill_ci_profile(ctx, gi_handle, pid, engines, info, versioned=True)


@C.emulates("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
def ci_possible_placements(
    ctx: CallContext, gi_handle: object, pid: object, placements: object, count: object
) -> None:
    _, gi = ctx.gpu_instance(gi_handle)
    p = _ci_profile(gi, pid, returns.NOT_SUPPORTED)
    starts = FakeMachine.ci_placements(gi, p)
    _write_placements(placements, count, [(s, p.slices) for s in starts])


@C.emulates("nvmlGpuInstanceGetComputeInstanceRemainingCapacity")
def ci_remaining_capacity(ctx: CallContext, gi_handle: object, pid: object, out: object) -> None:
    _, gi = ctx.gpu_instance(gi_handle)
    p = _ci_profile(gi, pid, returns.NOT_SUPPORTED)
    cmem.write(out, len(FakeMachine.free_ci_placements(gi, p)))


@C.emulates("nvmlGpuInstanceCreateComputeInstance")
def create_ci(ctx: CallContext, gi_handle: object, pid: object, out: object) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    ci = ctx.machine.create_compute_instance(gpu.index, gi.id, cmem.as_int(pid), None)
    cmem.write_handle(out, ctx.ci_handle(gpu.index, gi.id, ci.id))


@C.emulates("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
def create_ci_with_placement(
    ctx: CallContext, gi_handle: object, pid: object, placement: object, out: object
) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    start, size = cmem.read_placement(placement)
    ci = ctx.machine.create_compute_instance(gpu.index, gi.id, cmem.as_int(pid), start, size)
    cmem.write_handle(out, ctx.ci_handle(gpu.index, gi.id, ci.id))


@C.emulates("nvmlComputeInstanceDestroy")
def destroy_ci(ctx: CallContext, ci_handle: object) -> None:
    gpu, gi, ci = ctx.compute_instance(ci_handle)
    ctx.machine.destroy_compute_instance(gpu.index, gi.id, ci.id)


@C.emulates("nvmlGpuInstanceGetComputeInstances")
def compute_instances(
    ctx: CallContext, gi_handle: object, pid: object, out: object, count: object
) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    p = _ci_profile(gi, pid, returns.NOT_SUPPORTED)
    found = sorted(ci.id for ci in gi.compute_instances.values() if ci.profile.id == p.id)
    _write_handles(out, count, [ctx.ci_handle(gpu.index, gi.id, i) for i in found])


@C.emulates("nvmlGpuInstanceGetComputeInstanceById")
def compute_instance_by_id(ctx: CallContext, gi_handle: object, ci_id: object, out: object) -> None:
    gpu, gi = ctx.gpu_instance(gi_handle)
    i = cmem.as_int(ci_id)
    if i not in gi.compute_instances:
        raise NvmlReturn(returns.NOT_FOUND, f"no compute instance {i}")
    cmem.write_handle(out, ctx.ci_handle(gpu.index, gi.id, i))


@C.emulates("nvmlComputeInstanceGetInfo_v2")
def compute_instance_info(ctx: CallContext, ci_handle: object, out: object) -> None:
    gpu, gi, ci = ctx.compute_instance(ci_handle)
    info = cmem.target(out)
    cmem.set_pointer_field(info, "device", ctx.device_handle(gpu.index))
    cmem.set_pointer_field(info, "gpuInstance", ctx.gi_handle(gpu.index, gi.id))
    info.id = ci.id
    info.profileId = ci.profile.id
    info.placement.start = ci.start
    info.placement.size = ci.profile.slices
