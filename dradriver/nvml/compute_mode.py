"""A GPU's compute mode through NVML (EXCLUSIVE_PROCESS while an MPS daemon serves it)."""

from __future__ import annotations

from types import ModuleType

from dradriver.errors import SharingError


def get_compute_mode(nvml: ModuleType, uuid: str) -> int:
    try:
        return int(nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid)))
    except nvml.NVMLError as err:
        raise SharingError(
            f"reading the compute mode of {uuid}: {err}", reason="compute_mode"
        ) from err


def set_compute_mode(nvml: ModuleType, uuid: str, mode: int) -> None:
    try:
        nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByUUID(uuid), mode)
    except nvml.NVMLError as err:
        raise SharingError(
            f"setting the compute mode of {uuid}: {err}", reason="compute_mode"
        ) from err


def exclusive_process(nvml: ModuleType) -> int:
    return int(nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
