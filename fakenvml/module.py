"""A private copy of the real pynvml module whose C library is the fake.

Each copy has its own globals (loaded library, function-pointer cache, error classes), so
several fake nodes live in one process. Only the copy's `CDLL` is replaced: nvmlInit
runs pynvml's own loading path, which now finds the fake library, or fails the way a
missing libnvidia-ml.so.1 fails when the fault asks for that.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from types import ModuleType

from fakenvml.clib import FakeNvmlLibrary
from fakenvml.faults import InitFailure

_LIBRARY_NAMES = ("libnvidia-ml.so.1", "nvml.dll")
_serial = itertools.count()


def private_pynvml(library: FakeNvmlLibrary, node: str) -> ModuleType:
    found = importlib.util.find_spec("pynvml")
    if found is None or found.origin is None:
        raise ImportError("nvidia-ml-py (module pynvml) is not installed")
    safe_node = re.sub(r"\W", "_", node)
    name = f"_dradriver_fake_pynvml_{safe_node}_{next(_serial)}"
    spec = importlib.util.spec_from_file_location(name, found.origin)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load pynvml from {found.origin}")
    module = importlib.util.module_from_spec(spec)
    # pynvml builds its NVMLError_* classes on sys.modules[__name__] while it loads.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]

    def dlopen(path: str, *args: object, **kwargs: object) -> FakeNvmlLibrary:
        missing = library.machine.faults.init_failure is InitFailure.LIBRARY_NOT_FOUND
        if missing or not path.endswith(_LIBRARY_NAMES):
            raise OSError(f"{path}: cannot open shared object file: No such file or directory")
        return library

    module.CDLL = dlopen  # type: ignore[attr-defined]
    return module
