"""The fake libnvidia-ml.so.1: an object whose attributes are the C entry points.

pynvml looks every C function up with getattr on the loaded library and calls it with
ctypes arguments; here each one is a CFunction that runs its emulation under the machine
lock and returns the NVML return code, so pynvml's own error handling runs unchanged.
A C function the fake does not emulate returns NVML_ERROR_FUNCTION_NOT_FOUND, quietly,
as a missing symbol of an older driver would make pynvml report.
"""

from __future__ import annotations

import ctypes
from typing import Any

from fakenvml import c_device, c_events, c_limits, c_links, c_mig, c_system, returns
from fakenvml.context import CallContext, CImpl
from fakenvml.handles import HandleCodec
from fakenvml.machine import FakeMachine
from fakenvml.returns import NvmlReturn

EMULATED: dict[str, CImpl] = {
    **c_system.C.functions,
    **c_device.C.functions,
    **c_mig.C.functions,
    **c_links.C.functions,
    **c_events.C.functions,
    **c_limits.C.functions,
}


class CFunction:
    """One C entry point. Like a ctypes function pointer it takes attribute assignments
    (pynvml sets `restype` on some) and returns what the C function would."""

    def __init__(self, lib: FakeNvmlLibrary, name: str, impl: CImpl | None) -> None:
        self.__name__ = name
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None
        self._lib = lib
        self._impl = impl

    def __call__(self, *args: object) -> object:
        return self._lib.call(self.__name__, self._impl, args)

    def __repr__(self) -> str:
        return f"<fake NVML function {self.__name__}>"


class FakeNvmlLibrary:
    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.context = CallContext(machine, HandleCodec(machine.tag))
        for name, impl in EMULATED.items():
            setattr(self, name, CFunction(self, name, impl))

    def __getattr__(self, name: str) -> CFunction:
        # Only reached for names not set in __init__: C functions the fake lacks.
        if not name.startswith("nvml"):
            raise AttributeError(name)
        fn = CFunction(self, name, None)
        setattr(self, name, fn)
        return fn

    @property
    def initialized(self) -> bool:
        return self.context.init_count > 0

    def call(self, name: str, impl: CImpl | None, args: tuple[object, ...]) -> object:
        with self.machine.lock:
            injected = self.machine.faults.take(name)
            if injected is not None:
                return injected
            if impl is None:
                return returns.FUNCTION_NOT_FOUND
            if name not in c_system.WITHOUT_INIT and not self.initialized:
                return returns.UNINITIALIZED
            try:
                result = impl(self.context, *args)
            except NvmlReturn as r:
                return r.code
            return returns.SUCCESS if result is None else result
