"""IMEX channels in the prepare plan (pure): the node's channel device allocated to a
claim, with the ComputeDomain and channel number its config names, becomes a record
whose daemon hardware/imex.py starts; one domain per node at a time (one IMEX daemon a
node: the scheduler allocates the device once, and a second is refused here too).
"""

from __future__ import annotations

import itertools
from typing import Any

from dradriver.api.computedomain import CHANNEL_DEVICE, CHANNEL_TYPE
from dradriver.errors import ConfigError, DeviceError
from dradriver.kubeletplugin.prepare import cdi
from dradriver.kubeletplugin.state.records import Checkpoint, ClaimRef, ImexDaemon, PreparedDevice
from dradriver.nvml.host import DeviceNode


def is_channel(device: str) -> bool:
    return device == CHANNEL_DEVICE


def channel_device(
    ref: ClaimRef,
    driver: str,
    node: str,
    *,
    request: str,
    device: str,
    configs: tuple[dict[str, Any], ...],
) -> PreparedDevice:
    """The record of a channel device; its config must say which ComputeDomain."""
    from dradriver.api.config import ComputeDomainChannelConfig, effective

    try:
        cfg = effective(list(configs), CHANNEL_TYPE, request)
    except ConfigError as exc:
        raise ConfigError(f"claim {ref}: {exc}", reason="config") from exc
    if not isinstance(cfg, ComputeDomainChannelConfig):
        raise ConfigError(
            f"claim {ref}: device {device} is an IMEX channel, which is given only for a "
            "ComputeDomain: make the claim from the domain's ResourceClaimTemplate "
            "(spec.channel.resourceClaimTemplate.name), whose config names the domain",
            reason="config",
        )
    return PreparedDevice(
        request_names=[request],
        pool=node,
        device=device,
        # A channel is one CDI device: no shares, so its CDI name is the device's.
        cdi_device_ids=[cdi.qualified_name(driver, device, ref.uid)],
        kind=CHANNEL_TYPE,
        imex=ImexDaemon(cfg.domainUID, cfg.domain, ref.namespace, cfg.channel),
    )


def check_one_domain(cp: Checkpoint, ref: ClaimRef, channels: list[PreparedDevice]) -> None:
    """A node runs one IMEX daemon: a channel of another domain, or the same channel in
    another claim, is refused while a claim here holds one."""
    for other in cp.claims.values():
        held = [od for od in other.devices if od.imex is not None and other.uid != ref.uid]
        for od, d in itertools.product(held, channels):
            assert od.imex is not None and d.imex is not None
            if od.device == d.device or od.imex.domain_uid != d.imex.domain_uid:
                raise DeviceError(
                    f"claim {ref}: this node's IMEX daemon serves ComputeDomain "
                    f"{od.imex.namespace}/{od.imex.domain} (claim "
                    f"{other.namespace}/{other.name}, {od.device}); a node is in one "
                    f"IMEX domain at a time, so {d.device} of ComputeDomain "
                    f"{d.imex.namespace}/{d.imex.domain} waits until that one ends",
                    reason="imex_node_busy",
                )


def channel_cdi_device(d: PreparedDevice, node: DeviceNode) -> cdi.CdiDevice:
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
