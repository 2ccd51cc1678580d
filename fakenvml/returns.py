"""NVML return codes as the fake raises them internally; clib turns them back into the
integer a C function returns."""

from __future__ import annotations

import pynvml

SUCCESS: int = pynvml.NVML_SUCCESS
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
LIB_RM_VERSION_MISMATCH: int = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
IN_USE: int = pynvml.NVML_ERROR_IN_USE
INSUFFICIENT_RESOURCES: int = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN


class NvmlReturn(Exception):
    """Raised anywhere inside the fake to end the emulated C call with `code`."""

    def __init__(self, code: int, why: str = "") -> None:
        super().__init__(f"NVML return {code}" + (f": {why}" if why else ""))
        self.code = code
        self.why = why


_STRINGS = {
    SUCCESS: "Success",
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    NOT_FOUND: "Not Found",
    INSUFFICIENT_SIZE: "Insufficient Size",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    TIMEOUT: "Timeout",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires restart",
    LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    IN_USE: "In use by another client",
    INSUFFICIENT_RESOURCES: "Insufficient resources",
    ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    UNKNOWN: "Unknown Error",
}


def error_string(code: int) -> str:
    return _STRINGS.get(code, "Unknown Error")
