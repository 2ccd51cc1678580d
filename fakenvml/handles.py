"""Opaque NVML handles as pointer values that the fake can decode again.

NVML hands out pointers to its own structures; the fake hands out integers with the same
shape: kind, a tag of the machine that issued them, and the object's ids. A handle from
another fake machine, a NULL, or garbage decodes to NVML_ERROR_INVALID_ARGUMENT.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from fakenvml.returns import INVALID_ARGUMENT, NvmlReturn


class Kind(IntEnum):
    DEVICE = 1
    MIG_DEVICE = 2  # a device handle too: NVML accepts both kinds where devices go
    GPU_INSTANCE = 3
    COMPUTE_INSTANCE = 4
    EVENT_SET = 5


class Handle(NamedTuple):
    """A tuple, not a frozen dataclass: every fake NVML call decodes one, and a frozen
    dataclass's construction was a sixth of a call."""

    kind: Kind
    gpu: int = 0  # GPU index; the set id for EVENT_SET
    gi: int = 0
    ci: int = 0


_KINDS = {int(k): k for k in Kind}


class HandleCodec:
    def __init__(self, tag: int) -> None:
        self._tag = tag & 0xFFFF

    def encode(self, h: Handle) -> int:
        return (
            int(h.kind) << 48
            | self._tag << 32
            | (h.gpu & 0xFFFF) << 16
            | (h.gi & 0xFF) << 8
            | (h.ci & 0xFF)
        )

    def decode(self, value: int | None, *kinds: Kind) -> Handle:
        if not value:
            raise NvmlReturn(INVALID_ARGUMENT, "NULL handle")
        kind = value >> 48
        if (value >> 32) & 0xFFFF != self._tag or kind not in kinds:
            raise NvmlReturn(INVALID_ARGUMENT, f"not a handle of this fake: {value:#x}")
        return Handle(_KINDS[kind], (value >> 16) & 0xFFFF, (value >> 8) & 0xFF, value & 0xFF)
