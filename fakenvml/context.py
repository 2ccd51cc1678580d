"""What an emulated C function works with: the machine, and handles in both directions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fakenvml import returns
from fakenvml.cmem import pointer_value
from fakenvml.handles import Handle, HandleCodec, Kind
from fakenvml.machine import ComputeInstance, FakeGpu, FakeMachine, GpuInstance
from fakenvml.returns import NvmlReturn

MigDevice = tuple[GpuInstance, ComputeInstance]


@dataclass
class CallContext:
    machine: FakeMachine
    codec: HandleCodec
    init_count: int = 0  # nvmlInit calls not yet matched by nvmlShutdown

    # -- handles out --------------------------------------------------------------

    def device_handle(self, index: int) -> int:
        return self.codec.encode(Handle(Kind.DEVICE, index))

    def mig_handle(self, index: int, gi: int, ci: int) -> int:
        return self.codec.encode(Handle(Kind.MIG_DEVICE, index, gi, ci))

    def gi_handle(self, index: int, gi: int) -> int:
        return self.codec.encode(Handle(Kind.GPU_INSTANCE, index, gi))

    def ci_handle(self, index: int, gi: int, ci: int) -> int:
        return self.codec.encode(Handle(Kind.COMPUTE_INSTANCE, index, gi, ci))

    def event_set_handle(self, set_id: int) -> int:
        return self.codec.encode(Handle(Kind.EVENT_SET, set_id))

    # -- handles in ----------------------------------------------------------------

    def any_device(self, arg: object) -> tuple[FakeGpu, MigDevice | None]:
        """A GPU or MIG device handle: the GPU, and the MIG device if it is one."""
        h = self.codec.decode(pointer_value(arg), Kind.DEVICE, Kind.MIG_DEVICE)
        gpu = self.machine.gpu(h.gpu)
        if h.kind is Kind.DEVICE:
            return gpu, None
        if not gpu.mig_enabled:
            raise NvmlReturn(returns.INVALID_ARGUMENT, "stale MIG device handle")
        gi = self.machine.gpu_instance(h.gpu, h.gi)
        return gpu, (gi, self.machine.compute_instance(h.gpu, h.gi, h.ci))

    def device(self, arg: object, on_mig: int = returns.NOT_SUPPORTED) -> FakeGpu:
        """A full-GPU handle; a MIG device handle gets `on_mig`."""
        gpu, mig = self.any_device(arg)
        if mig is not None:
            raise NvmlReturn(on_mig, "not available on a MIG device handle")
        return gpu

    def gpu_instance(self, arg: object) -> tuple[FakeGpu, GpuInstance]:
        h = self.codec.decode(pointer_value(arg), Kind.GPU_INSTANCE)
        gi = self.machine.gpu_instance(h.gpu, h.gi)
        return self.machine.gpus[h.gpu], gi

    def compute_instance(self, arg: object) -> tuple[FakeGpu, GpuInstance, ComputeInstance]:
        h = self.codec.decode(pointer_value(arg), Kind.COMPUTE_INSTANCE)
        ci = self.machine.compute_instance(h.gpu, h.gi, h.ci)
        return self.machine.gpus[h.gpu], self.machine.gpu_instance(h.gpu, h.gi), ci

    def event_set(self, arg: object) -> int:
        return self.codec.decode(pointer_value(arg), Kind.EVENT_SET).gpu


CImpl = Callable[..., object]


class Registry:
    """Collects the emulated C functions of one module: name -> implementation. An
    implementation takes the CallContext and the C arguments; it returns None for
    NVML_SUCCESS, or raises NvmlReturn."""

    def __init__(self) -> None:
        self.functions: dict[str, CImpl] = {}

    def emulates(self, *names: str) -> Callable[[CImpl], CImpl]:
        def register(fn: CImpl) -> CImpl:
            for name in names:
                self.functions[name] = fn
            return fn

        return register
