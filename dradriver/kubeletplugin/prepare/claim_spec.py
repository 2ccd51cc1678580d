"""A claim's CDI spec from its record (pure but for the node's device nodes, which the
GPU host answers): each device's nodes, and the environment and mounts its sharing, its
share or its IMEX channel gives the container."""

from __future__ import annotations

from typing import Any

from dradriver.kubeletplugin.hardware.shares import share_edits
from dradriver.kubeletplugin.hardware.sharing import container_edits
from dradriver.kubeletplugin.prepare import cdi
from dradriver.kubeletplugin.state.records import ClaimRecord, PreparedDevice
from dradriver.nvml.host import DeviceNode, GpuHost


def claim_spec(rec: ClaimRecord, *, driver: str, host: GpuHost) -> dict[str, Any]:
    devices = []
    for d in rec.devices:
        env: list[str] = []
        mounts: list[tuple[str, str, str]] = []
        # What a device of a sharing setup or a share adds; a device held whole, nothing.
        if d.sharing is not None:
            env, mounts = container_edits(d)
        if d.share is not None:
            more_env, more_mounts = share_edits(d)
            env += more_env + share_env(d)
            mounts += more_mounts
        if d.imex is not None:
            devices.append(imex_device(d, host.imex_channel_node(d.imex.channel)))
            continue
        nodes = host.device_nodes(d.minor, d.mig_ids())
        devices.append(
            cdi.CdiDevice(
                name=d.cdi_name,
                device=d.device,
                uuid=d.uuid or "",
                device_nodes=tuple(nodes),
                group=",".join(d.request_names),
                env=tuple(env),
                mounts=tuple(mounts),
            )
        )
    return cdi.claim_spec(
        driver,
        rec.uid,
        devices,
        claim_name=rec.ref,
        control_nodes=host.control_device_nodes(),
    )


def imex_device(d: PreparedDevice, node: DeviceNode) -> cdi.CdiDevice:
    """An IMEX channel in the container: its device node, and which domain and channel."""
    assert d.imex is not None
    return cdi.CdiDevice(
        name=d.cdi_name,
        device=d.device,
        uuid="",
        device_nodes=(node,),
        group=",".join(d.request_names),
        env=(
            f"DRADRIVER_IMEX_CHANNEL={d.imex.channel}",
            f"DRADRIVER_COMPUTE_DOMAIN={d.imex.namespace}/{d.imex.domain}",
        ),
        gpu=False,
    )


def share_env(d: PreparedDevice) -> list[str]:
    """What a share was allocated, for the workload to size itself by (a framework's
    memory fraction, a server's worker count): the shareID and the limits prepare
    derived from the allocation (prepare/shares.py)."""
    if d.share is None:
        return []
    env = [f"DRADRIVER_SHARE_ID={d.share.share_id}"]
    if d.share.memory_limit is not None:
        env.append(f"DRADRIVER_SHARE_MEMORY_LIMIT={d.share.memory_limit}")
    if d.share.compute_limit is not None:
        env.append(f"DRADRIVER_SHARE_COMPUTE_LIMIT={d.share.compute_limit}")
    return env
