"""Emulated C functions: event sets (XID critical errors and other device events)."""

from __future__ import annotations

from fakenvml import cmem, returns
from fakenvml.c_device import SUPPORTED_EVENTS
from fakenvml.context import CallContext, Registry
from fakenvml.returns import NvmlReturn

C = Registry()


@C.emulates("nvmlEventSetCreate")
def create(ctx: CallContext, out: object) -> None:
    cmem.write_handle(out, ctx.event_set_handle(ctx.machine.events.create()))


@C.emulates("nvmlDeviceRegisterEvents")
def register(ctx: CallContext, handle: object, types: object, event_set: object) -> None:
    gpu = ctx.device(handle)
    mask = cmem.as_int(types)
    if mask & ~SUPPORTED_EVENTS:
        raise NvmlReturn(returns.NOT_SUPPORTED, f"event types {mask & ~SUPPORTED_EVENTS:#x}")
    ctx.machine.events.register(ctx.event_set(event_set), gpu.index, mask)


@C.emulates("nvmlEventSetWait_v2")
def wait(ctx: CallContext, event_set: object, out: object, timeout_ms: object) -> None:
    event = ctx.machine.events.wait(ctx.event_set(event_set), cmem.as_int(timeout_ms))
    if event is None:
        raise NvmlReturn(returns.TIMEOUT, "no event")
    data = cmem.target(out)
    cmem.set_pointer_field(data, "device", ctx.device_handle(event.gpu))
    data.eventType = event.event_type
    data.eventData = event.data
    data.gpuInstanceId = event.gpu_instance_id
    data.computeInstanceId = event.compute_instance_id


@C.emulates("nvmlEventSetFree")
def free(ctx: CallContext, event_set: object) -> None:
    ctx.machine.events.free(ctx.event_set(event_set))
