"""Which physical GPU an allocated device name stands for, checked before prepare against
the name book (state/name_book.py), so that a claim is never prepared on another GPU than
the one it was allocated. See docs/design.md, "Prepare: read, plan, apply, record"."""

from __future__ import annotations

from collections.abc import Mapping

from dradriver.api.computedomain import CHANNEL_DEVICE
from dradriver.errors import DeviceError
from dradriver.inventory.naming import GpuIdentity, gpu_name_of
from dradriver.inventory.node_devices import NodeDevice, gpu_device_name
from dradriver.kubeletplugin.claimref import ClaimRef

_AGAIN = (
    "the claim must be allocated again: delete the pod (a claim from a template is then "
    "made anew) or the claim, and the scheduler picks a device this node publishes now"
)


def check_identity(
    ref: ClaimRef,
    device: str,
    dev: NodeDevice | None,
    *,
    book: Mapping[str, GpuIdentity],
    devices: Mapping[str, NodeDevice],
) -> None:
    """Raises DeviceError when `device` is not the GPU it was published for, or that GPU
    is gone; returns for a device this node publishes as what it was. `devices`, what
    the node publishes now, is read only to say what became of a name it no longer has."""
    published = book.get(gpu_name_of(device))
    if dev is not None:
        if published is not None and published.uuid != dev.gpu.uuid:
            raise DeviceError(
                f"claim {ref}: device {device} was published for GPU {published.describe()}, "
                f"but that name is GPU {GpuIdentity.of(dev.gpu).describe()} now; the node "
                f"refuses to prepare a claim on another GPU than it was allocated; {_AGAIN}",
                reason="identity_mismatch",
            )
        return
    if published is None and device == CHANNEL_DEVICE:
        raise DeviceError(
            f"claim {ref}: device {device} is an IMEX channel, which this node does not "
            "publish (any more): its GPUs are not all in one fabric clique, its driver is "
            "older than 570.158.01, or the plugin runs with --imex-channels off; "
            f"{_AGAIN}",
            reason="not_published",
        )
    if published is None:
        raise DeviceError(
            f"claim {ref}: device {device} is not published by this node (any more); {_AGAIN}",
            reason="not_published",
        )
    now = next((d.gpu for d in devices.values() if d.gpu.uuid == published.uuid), None)
    if now is not None:
        raise DeviceError(
            f"claim {ref}: device {device} was published for GPU {published.describe()}, which "
            f"this node publishes as {gpu_device_name(now)} now (a GPU published in "
            f"another mode); {_AGAIN}",
            reason="renamed",
        )
    raise DeviceError(
        f"claim {ref}: device {device} is GPU {published.describe()}, which this node does not "
        "have now (it fell off the bus, was taken out, or NVML cannot read it: see "
        f"`nvidia-smi` and the plugin's log); {_AGAIN}",
        reason="gpu_gone",
    )
