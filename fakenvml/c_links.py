"""Emulated C functions: NVLink state and endpoints, and the GPU fabric (multi-node NVLink).

A GPU without NVLink (an L4, or a group with nvlink=none) answers NOT_SUPPORTED for every
link; a link index past the product's links is INVALID_ARGUMENT.
"""

from __future__ import annotations

import pynvml

from fakenvml import cmem, returns
from fakenvml.c_device import fill_pci
from fakenvml.context import CallContext, Registry
from fakenvml.returns import NvmlReturn
from fakenvml.topology import LinkEnd

C = Registry()

_FABRIC_V2: int = pynvml.nvmlGpuFabricInfo_v2
_FABRIC_V3: int = pynvml.nvmlGpuFabricInfo_v3


def _link(ctx: CallContext, handle: object, link: object) -> tuple[LinkEnd, int]:
    gpu = ctx.device(handle)
    if not gpu.layout.links:
        raise NvmlReturn(returns.NOT_SUPPORTED, "no NVLink")
    i = cmem.as_int(link)
    if not 0 <= i < len(gpu.layout.links):
        raise NvmlReturn(returns.INVALID_ARGUMENT, f"link {i}")
    return gpu.layout.links[i], gpu.layout.product.nvlink_version


@C.emulates("nvmlDeviceGetNvLinkState")
def link_state(ctx: CallContext, handle: object, link: object, out: object) -> None:
    _link(ctx, handle, link)
    cmem.write(out, pynvml.NVML_FEATURE_ENABLED)


@C.emulates("nvmlDeviceGetNvLinkVersion")
def link_version(ctx: CallContext, handle: object, link: object, out: object) -> None:
    cmem.write(out, _link(ctx, handle, link)[1])


@C.emulates("nvmlDeviceGetNvLinkRemotePciInfo_v2")
def remote_pci_info(ctx: CallContext, handle: object, link: object, out: object) -> None:
    end, _ = _link(ctx, handle, link)
    fill_pci(cmem.target(out), end.pci.domain, end.pci.bus, end.pci_device_id, end.pci_subsystem_id)


@C.emulates("nvmlDeviceGetNvLinkRemoteDeviceType")
def remote_device_type(ctx: CallContext, handle: object, link: object, out: object) -> None:
    cmem.write(out, _link(ctx, handle, link)[0].device_type)


def _fabric(ctx: CallContext, handle: object) -> tuple[bytes, int]:
    gpu = ctx.device(handle)
    if gpu.layout.fabric is None:
        raise NvmlReturn(returns.NOT_SUPPORTED, "no NVLink fabric")
    return gpu.layout.fabric


@C.emulates("nvmlDeviceGetGpuFabricInfoV")
def fabric_info(ctx: CallContext, handle: object, out: object) -> None:
    info = cmem.target(out)
    version = getattr(info, "version", None)
    if version not in (_FABRIC_V2, _FABRIC_V3):
        raise NvmlReturn(returns.ARGUMENT_VERSION_MISMATCH, "nvmlGpuFabricInfo_t version")
    cluster, clique = _fabric(ctx, handle)
    info.clusterUuid[:] = list(cluster)
    cmem.fill(
        info,
        status=returns.SUCCESS,
        cliqueId=clique,
        state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
        healthMask=0,
        healthSummary=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
    )


@C.emulates("nvmlDeviceGetGpuFabricInfo")
def fabric_info_v1(ctx: CallContext, handle: object, out: object) -> None:
    info = cmem.target(out)
    cluster, clique = _fabric(ctx, handle)
    info.clusterUuid[:] = list(cluster)
    cmem.fill(
        info,
        status=returns.SUCCESS,
        cliqueId=clique,
        state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
    )
