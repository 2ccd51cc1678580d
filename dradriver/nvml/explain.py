"""NVML failures turned into messages that name the layer and what to check."""

from __future__ import annotations

from types import ModuleType


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used at all on this node; the message says why and what to check."""


_INIT_HINTS = {
    "NVMLError_LibraryNotFound": (
        "driver layer: libnvidia-ml.so.1 was not found. The NVIDIA driver is not installed "
        "on this node, or its libraries are not visible to the plugin: check that the "
        "driver root is mounted into the container (Helm value driverRoot) and "
        "LD_LIBRARY_PATH."
    ),
    "NVMLError_DriverNotLoaded": (
        "driver layer: the NVIDIA kernel driver is not loaded. Check `lsmod | grep nvidia` "
        "and `dmesg` on the node; install the driver or reboot after installing it."
    ),
    "NVMLError_LibRmVersionMismatch": (
        "driver layer: the NVML library and the loaded kernel driver are different versions, "
        "usually after a driver upgrade without a reboot. Reboot the node (or reload the "
        "nvidia kernel modules)."
    ),
    "NVMLError_NoPermission": (
        "driver layer: permission denied opening the GPU device nodes. The plugin needs "
        "/dev/nvidiactl and /dev/nvidia*; run it privileged or mount those device nodes."
    ),
}


def explain_init_failure(nvml: ModuleType, err: Exception) -> NvmlUnavailable:
    name = type(err).__name__
    hint = _INIT_HINTS.get(name)
    if hint is None:
        hint = f"driver layer: NVML could not be initialised ({name}: {err})."
    return NvmlUnavailable(f"NVML init failed: {hint}")
