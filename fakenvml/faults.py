"""Failures a test can inject into a fake machine: failing calls, lost GPUs, XID events,
and an NVML library that cannot be initialised."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import pynvml

from fakenvml import returns

if TYPE_CHECKING:
    from fakenvml.machine import FakeMachine

XID_FALLEN_OFF_THE_BUS = 79
# What the driver leaves behind after an XID, from NVIDIA's XID catalogue
# (docs.nvidia.com/deploy/xid-errors) and its GPU memory error management guide
# (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt): XID 48 is a double-bit ECC error
# (the DBE counter rises, so nvmlEventTypeDoubleBitEccError fires too); 48, 94
# (contained ECC error) and 95 (uncontained ECC error) leave a row remapping pending
# until the GPU is reset, on GPUs with row remapping.
XID_DOUBLE_BIT_ECC = 48
XIDS_REMAP_PENDING = frozenset({48, 94, 95})


class InitFailure(Enum):
    """Why nvmlInit fails; each becomes the pynvml exception named alongside."""

    LIBRARY_NOT_FOUND = returns.LIBRARY_NOT_FOUND  # NVMLError_LibraryNotFound
    DRIVER_NOT_LOADED = returns.DRIVER_NOT_LOADED  # NVMLError_DriverNotLoaded
    LIB_RM_VERSION_MISMATCH = returns.LIB_RM_VERSION_MISMATCH  # NVMLError_LibRmVersionMismatch
    NO_PERMISSION = returns.NO_PERMISSION  # NVMLError_NoPermission


class Faults:
    def __init__(self, machine: FakeMachine) -> None:
        self._machine = machine
        self._countdowns: dict[str, list[tuple[int, int]]] = {}  # name -> [(calls left, code)]
        self.init_failure: InitFailure | None = None

    def fail_nth(self, function_name: str, n: int, code: int) -> None:
        """The n-th call from now (1 = the next) of C function `function_name`, e.g.
        "nvmlDeviceGetHandleByIndex_v2", returns `code` without doing anything."""
        if not function_name.startswith("nvml"):
            raise ValueError(f"{function_name!r} is not an NVML C function name")
        if n < 1:
            raise ValueError(f"n counts calls from 1, not {n}")
        if code == returns.SUCCESS:
            raise ValueError("an injected failure needs a non-zero NVML return code")
        with self._machine.lock:
            self._countdowns.setdefault(function_name, []).append((n, code))

    def take(self, function_name: str) -> int | None:
        """Counts one call of `function_name`; the injected code if this call fails."""
        pending = self._countdowns.get(function_name)
        if not pending:
            return None
        code: int | None = None
        left: list[tuple[int, int]] = []
        for calls, c in pending:
            if calls == 1 and code is None:
                code = c
            elif calls > 1:
                left.append((calls - 1, c))
        self._countdowns[function_name] = left
        return code

    def lose_gpu(self, index: int) -> None:
        """GPU `index` falls off the bus: every call on it returns NVML_ERROR_GPU_IS_LOST
        until a reset, and registered event sets get XID 79, as the driver reports it."""
        self._machine.lose_gpu(index)
        self.raise_xid(index, XID_FALLEN_OFF_THE_BUS)

    def raise_xid(
        self,
        index: int,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Queue an XID critical error event on GPU `index` for nvmlEventSetWait."""
        self._machine.post_event(
            index,
            pynvml.nvmlEventTypeXidCriticalError,
            xid,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
        )

    def xid_error(
        self,
        index: int,
        xid: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """XID `xid` as the driver raises it on GPU `index`: the event, plus the state
        it leaves the GPU in (79: off the bus; 48: also a DBE ECC event; 48, 94, 95: a
        row remapping pending where the GPU remaps rows). `raise_xid` posts the event
        alone."""
        if xid == XID_FALLEN_OFF_THE_BUS:
            self.lose_gpu(index)
            return
        if xid in XIDS_REMAP_PENDING and self._machine.gpus[index].layout.product.row_remapping:
            self._machine.set_remap_pending(index)
        self.raise_xid(
            index, xid, gpu_instance_id=gpu_instance_id, compute_instance_id=compute_instance_id
        )
        if xid == XID_DOUBLE_BIT_ECC:
            self._machine.post_event(index, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def fail_init(self, failure: InitFailure | None) -> None:
        """Make nvmlInit fail (None: succeed again), as on a node whose driver is broken."""
        self.init_failure = failure

    def clear(self) -> None:
        with self._machine.lock:
            self._countdowns.clear()
            self.init_failure = None
