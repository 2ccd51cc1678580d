"""Emulated C functions: library lifetime, error strings, system versions."""

from __future__ import annotations

from fakenvml import cmem, returns
from fakenvml.context import CallContext, Registry
from fakenvml.returns import NvmlReturn

C = Registry()

# Callable before nvmlInit, as in the real library.
WITHOUT_INIT = frozenset({"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlErrorString"})


def _init(ctx: CallContext) -> None:
    failure = ctx.machine.faults.init_failure
    if failure is not None:
        raise NvmlReturn(failure.value, failure.name)
    ctx.init_count += 1


@C.emulates("nvmlInitWithFlags")
def init_with_flags(ctx: CallContext, flags: object) -> None:
    cmem.as_int(flags)
    _init(ctx)


@C.emulates("nvmlInit", "nvmlInit_v2")
def init(ctx: CallContext) -> None:
    _init(ctx)


@C.emulates("nvmlShutdown")
def shutdown(ctx: CallContext) -> None:
    ctx.init_count -= 1


@C.emulates("nvmlErrorString")
def error_string(ctx: CallContext, code: object) -> bytes:
    # pynvml sets restype = c_char_p on this one: the C function returns a string.
    return returns.error_string(cmem.as_int(code)).encode()


@C.emulates("nvmlSystemGetDriverVersion")
def driver_version(ctx: CallContext, buf: object, length: object) -> None:
    cmem.write_string(buf, length, ctx.machine.driver_version)


@C.emulates("nvmlSystemGetNVMLVersion")
def nvml_version(ctx: CallContext, buf: object, length: object) -> None:
    major = ctx.machine.cuda_driver_version // 1000
    cmem.write_string(buf, length, f"{major}.{ctx.machine.driver_version}")


@C.emulates("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def cuda_driver_version(ctx: CallContext, out: object) -> None:
    cmem.write(out, ctx.machine.cuda_driver_version)
