"""Emulated C functions: device enumeration and per-device queries and settings.

A MIG device handle answers name, UUID, memory, attributes and the chip's properties;
other device queries return NOT_SUPPORTED for it.
"""

from __future__ import annotations

from typing import Any

import pynvml

from fakenvml import cmem, returns
from fakenvml.context import CallContext, MigDevice, Registry
from fakenvml.machine import FakeGpu
from fakenvml.returns import NvmlReturn

C = Registry()

_MIB = 1024 * 1024
SUPPORTED_EVENTS: int = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)


def mig_name(gpu: FakeGpu, mig: MigDevice) -> str:
    """nvidia-smi's "MIG 3g.40gb", or "MIG 1c.3g.40gb" for a smaller compute instance."""
    gi, ci = mig
    profile = gi.profile.name
    if ci.profile.slices != gi.profile.compute_slices:
        profile = f"{ci.profile.slices}c.{profile}"
    return f"{gpu.layout.product.name} MIG {profile}"


@C.emulates("nvmlDeviceGetCount_v2")
def count(ctx: CallContext, out: object) -> None:
    cmem.write(out, len(ctx.machine.gpus))


@C.emulates("nvmlDeviceGetHandleByIndex_v2")
def handle_by_index(ctx: CallContext, index: object, out: object) -> None:
    gpu = ctx.machine.gpu(cmem.as_int(index))
    cmem.write_handle(out, ctx.device_handle(gpu.index))


@C.emulates("nvmlDeviceGetHandleByUUID")
def handle_by_uuid(ctx: CallContext, uuid: object, out: object) -> None:
    wanted = cmem.read_string(uuid)
    for gpu in ctx.machine.gpus:
        if gpu.uuid == wanted:
            cmem.write_handle(out, ctx.device_handle(ctx.machine.gpu(gpu.index).index))
            return
        for gi, ci in gpu.mig_devices() if gpu.mig_enabled else []:
            if ci.uuid == wanted:
                ctx.machine.gpu(gpu.index)
                cmem.write_handle(out, ctx.mig_handle(gpu.index, gi.id, ci.id))
                return
    raise NvmlReturn(returns.NOT_FOUND, f"no device {wanted}")


@C.emulates("nvmlDeviceGetHandleByPciBusId_v2")
def handle_by_pci_bus_id(ctx: CallContext, bus_id: object, out: object) -> None:
    wanted = cmem.read_string(bus_id).strip().upper()
    for gpu in ctx.machine.gpus:
        if wanted in (gpu.layout.pci.bus_id, gpu.layout.pci.legacy_bus_id):
            cmem.write_handle(out, ctx.device_handle(ctx.machine.gpu(gpu.index).index))
            return
    raise NvmlReturn(returns.NOT_FOUND, f"no device at {wanted}")


@C.emulates("nvmlDeviceGetName")
def name(ctx: CallContext, handle: object, buf: object, length: object) -> None:
    gpu, mig = ctx.any_device(handle)
    text = mig_name(gpu, mig) if mig else gpu.layout.product.name
    cmem.write_string(buf, length, text)


@C.emulates("nvmlDeviceGetUUID")
def uuid(ctx: CallContext, handle: object, buf: object, length: object) -> None:
    gpu, mig = ctx.any_device(handle)
    cmem.write_string(buf, length, mig[1].uuid if mig else gpu.uuid)


@C.emulates("nvmlDeviceGetIndex")
def index(ctx: CallContext, handle: object, out: object) -> None:
    cmem.write(out, ctx.device(handle).index)


@C.emulates("nvmlDeviceGetMinorNumber")
def minor_number(ctx: CallContext, handle: object, out: object) -> None:
    cmem.write(out, ctx.device(handle).layout.minor)


def _memory_mib(ctx: CallContext, handle: object) -> int:
    gpu, mig = ctx.any_device(handle)
    return mig[0].profile.memory_mib if mig else gpu.layout.product.memory_mib


@C.emulates("nvmlDeviceGetMemoryInfo")
def memory_info(ctx: CallContext, handle: object, out: object) -> None:
    # Nothing runs on a fake GPU: all of its memory is free.
    total = _memory_mib(ctx, handle) * _MIB
    cmem.fill(cmem.target(out), total=total, free=total, used=0)


@C.emulates("nvmlDeviceGetMemoryInfo_v2")
def memory_info_v2(ctx: CallContext, handle: object, out: object) -> None:
    info = cmem.target(out)
    if getattr(info, "version", None) != pynvml.nvmlMemory_v2:
        raise NvmlReturn(returns.ARGUMENT_VERSION_MISMATCH, "nvmlMemory_t version")
    total = _memory_mib(ctx, handle) * _MIB
    cmem.fill(info, total=total, reserved=0, free=total, used=0)


@C.emulates("nvmlDeviceGetPciInfo_v3")
def pci_info(ctx: CallContext, handle: object, out: object) -> None:
    gpu = ctx.device(handle)
    product = gpu.layout.product
    pci = gpu.layout.pci
    fill_pci(cmem.target(out), pci.domain, pci.bus, product.pci_device_id, product.pci_subsystem_id)


def fill_pci(info: Any, domain: int, bus: int, device_id: int, subsystem_id: int) -> None:
    cmem.fill(
        info,
        busIdLegacy=f"{domain:04X}:{bus:02X}:00.0".encode(),
        domain=domain,
        bus=bus,
        device=0,
        pciDeviceId=device_id,
        pciSubSystemId=subsystem_id,
        busId=f"{domain:08X}:{bus:02X}:00.0".encode(),
    )


@C.emulates("nvmlDeviceGetNumaNodeId")
def numa_node(ctx: CallContext, handle: object, out: object) -> None:
    cmem.write(out, ctx.device(handle).layout.numa_node)


@C.emulates("nvmlDeviceGetCudaComputeCapability")
def compute_capability(ctx: CallContext, handle: object, major: object, minor: object) -> None:
    gpu, _ = ctx.any_device(handle)
    cc = gpu.layout.product.compute_capability
    cmem.write(major, cc[0])
    cmem.write(minor, cc[1])


@C.emulates("nvmlDeviceGetArchitecture")
def architecture(ctx: CallContext, handle: object, out: object) -> None:
    gpu, _ = ctx.any_device(handle)
    cmem.write(out, gpu.layout.product.architecture)


@C.emulates("nvmlDeviceGetBrand")
def brand(ctx: CallContext, handle: object, out: object) -> None:
    gpu, _ = ctx.any_device(handle)
    cmem.write(out, gpu.layout.product.brand)


@C.emulates("nvmlDeviceGetAttributes_v2")
def attributes(ctx: CallContext, handle: object, out: object) -> None:
    # NVML answers this for MIG device handles only.
    _, mig = ctx.any_device(handle)
    if mig is None:
        raise NvmlReturn(returns.NOT_SUPPORTED, "attributes are for MIG device handles")
    gi, ci = mig
    p = gi.profile
    cmem.fill(
        cmem.target(out),
        multiprocessorCount=p.multiprocessors * ci.profile.slices // p.compute_slices,
        sharedCopyEngineCount=p.copy_engines,
        sharedDecoderCount=p.decoders,
        sharedEncoderCount=p.encoders,
        sharedJpegCount=p.jpegs,
        sharedOfaCount=p.ofas,
        gpuInstanceSliceCount=p.compute_slices,
        computeInstanceSliceCount=ci.profile.slices,
        memorySizeMB=p.memory_mib,
    )


@C.emulates("nvmlDeviceGetComputeMode")
def compute_mode(ctx: CallContext, handle: object, out: object) -> None:
    cmem.write(out, ctx.device(handle).compute_mode)


@C.emulates("nvmlDeviceSetComputeMode")
def set_compute_mode(ctx: CallContext, handle: object, mode: object) -> None:
    ctx.machine.set_compute_mode(ctx.device(handle).index, cmem.as_int(mode))


@C.emulates("nvmlDeviceGetSupportedEventTypes")
def supported_event_types(ctx: CallContext, handle: object, out: object) -> None:
    ctx.device(handle)
    cmem.write(out, SUPPORTED_EVENTS)


@C.emulates("nvmlDeviceGetRemappedRows")
def remapped_rows(
    ctx: CallContext, handle: object, corr: object, unc: object, pending: object, failure: object
) -> None:
    gpu = ctx.device(handle)
    if not gpu.layout.product.row_remapping:
        raise NvmlReturn(returns.NOT_SUPPORTED, f"{gpu.layout.product.key} has no row remapping")
    # A pending remapping is one uncorrectable row waiting for the reset.
    cmem.write(corr, 0)
    cmem.write(unc, 1 if gpu.remap_pending else 0)
    cmem.write(pending, 1 if gpu.remap_pending else 0)
    cmem.write(failure, 0)
