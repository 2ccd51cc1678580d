"""Reading C arguments and writing C outputs the way the NVML shared library would.

Arguments arrive exactly as pynvml passes them to a ctypes function: Python ints,
ctypes scalars, `byref(x)` objects (target in `._obj`), ctypes pointers, arrays and
structures, or None for NULL. Outputs are written into the caller's memory by address,
so the structure classes of any pynvml module copy work alike.
"""

from __future__ import annotations

import ctypes
from typing import Any

from fakenvml.returns import INSUFFICIENT_SIZE, INVALID_ARGUMENT, NvmlReturn

_PTR = ctypes.sizeof(ctypes.c_void_p)


def as_int(arg: object) -> int:
    """An `unsigned int` / `int` argument passed by value."""
    if isinstance(arg, bool):
        return int(arg)
    if isinstance(arg, int):
        return arg
    value = getattr(arg, "value", None)
    if isinstance(value, int):
        return value
    raise NvmlReturn(INVALID_ARGUMENT, f"expected an integer argument, got {arg!r}")


def pointer_value(arg: object) -> int | None:
    """The address a pointer-typed argument (a handle) carries; None for NULL."""
    if arg is None:
        return None
    if isinstance(arg, int):
        return arg
    if isinstance(arg, ctypes.c_void_p):
        return arg.value
    if isinstance(arg, ctypes._Pointer):
        # The address the pointer holds, read from its own memory (a cast cost more).
        return ctypes.c_void_p.from_buffer(arg).value
    raise NvmlReturn(INVALID_ARGUMENT, f"expected a handle, got {arg!r}")


def target(ref: object) -> Any:
    """The ctypes object an output pointer argument points at."""
    if ref is None:
        raise NvmlReturn(INVALID_ARGUMENT, "NULL output pointer")
    obj = getattr(ref, "_obj", None)  # byref(x)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        if not ctypes.cast(ref, ctypes.c_void_p).value:
            raise NvmlReturn(INVALID_ARGUMENT, "NULL output pointer")
        return ref.contents
    if isinstance(ref, ctypes._SimpleCData | ctypes.Structure | ctypes.Array):
        return ref
    raise NvmlReturn(INVALID_ARGUMENT, f"expected an output pointer, got {ref!r}")


def is_null(ref: object) -> bool:
    if ref is None:
        return True
    if isinstance(ref, ctypes._Pointer | ctypes.c_void_p):
        return not pointer_value(ref)
    return False


def read(ref: object) -> Any:
    """The value behind an in/out scalar pointer."""
    return target(ref).value


def write(ref: object, value: int) -> None:
    target(ref).value = value


def address(ref: object) -> int:
    """Where the memory behind an output pointer starts."""
    if isinstance(ref, ctypes._Pointer) and getattr(ref, "_obj", None) is None:
        addr = ctypes.cast(ref, ctypes.c_void_p).value
        if not addr:
            raise NvmlReturn(INVALID_ARGUMENT, "NULL output pointer")
        return addr
    return ctypes.addressof(target(ref))


def capacity(ref: object) -> int | None:
    """How many elements the caller's array holds, when ctypes knows (NVML never does)."""
    obj = target(ref)
    return len(obj) if isinstance(obj, ctypes.Array) else None


def write_handle(ref: object, value: int, index: int = 0) -> None:
    ctypes.c_void_p.from_address(address(ref) + index * _PTR).value = value


def set_pointer_field(struct: Any, field: str, value: int) -> None:
    offset = getattr(type(struct), field).offset
    ctypes.c_void_p.from_address(ctypes.addressof(struct) + offset).value = value


class _Placement(ctypes.Structure):
    # The layout of both nvmlGpuInstancePlacement_t and nvmlComputeInstancePlacement_t.
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def write_placement(ref: object, index: int, start: int, size: int) -> None:
    p = _Placement.from_address(address(ref) + index * ctypes.sizeof(_Placement))
    p.start, p.size = start, size


def read_placement(ref: object) -> tuple[int, int]:
    p = _Placement.from_address(address(ref))
    return p.start, p.size


def write_string(buf: object, length: object, text: str) -> None:
    """A `char *buf, unsigned int length` output pair."""
    data = text.encode()
    if len(data) + 1 > as_int(length):
        raise NvmlReturn(INSUFFICIENT_SIZE, f"{len(data) + 1} bytes needed")
    obj = target(buf)
    if isinstance(obj, ctypes.Array) and len(obj) < len(data) + 1:
        raise NvmlReturn(INSUFFICIENT_SIZE, "buffer smaller than its stated length")
    ctypes.memmove(address(buf), data + b"\0", len(data) + 1)


def read_string(arg: object) -> str:
    """A `const char *` argument."""
    if isinstance(arg, bytes):
        return arg.decode(errors="replace")
    if isinstance(arg, str):
        return arg
    if isinstance(arg, ctypes.c_char_p):
        return (arg.value or b"").decode(errors="replace")
    if isinstance(arg, ctypes.Array):
        return bytes(arg).split(b"\0", 1)[0].decode(errors="replace")
    raise NvmlReturn(INVALID_ARGUMENT, f"expected a C string, got {arg!r}")


def fill(struct: Any, **fields: object) -> None:
    """Set the fields the caller's structure version has; others are left alone."""
    names = {f[0] for f in type(struct)._fields_}
    for name, value in fields.items():
        if name in names:
            setattr(struct, name, value)
