"""IMEX channel devices (pure): on a node whose GPUs are in one multi-node NVLink fabric
clique, `channel-0` .. `channel-<CHANNELS-1>`, each with the clique as its nvlinkDomain
and its number, in a slice of their own (a GPU's slice is rebuilt on every MIG change;
the channels never change while the clique holds).

A ComputeDomain's claim template selects the domain's channel number in the domain's
clique, so the job's claims land on that clique's nodes, one a node (a channel device is
allocated once). Channel N is /dev/nvidia-caps-imex-channels/channelN on the node.
"""

from __future__ import annotations

from dradriver.api import computedomain as cd
from dradriver.inventory.model import Inventory
from dradriver.slices.build import SliceContent

# NVIDIA's DRA driver needs this driver for IMEX channels in containers
# (../shared/reference/gpu-facts.md: "needs driver >= 570.158.01").
MIN_DRIVER = (570, 158, 1)
KEY = "imex-channels"


def node_clique(inv: Inventory) -> str | None:
    """The fabric clique (`<clusterUuid>.<cliqueId>`) all of the node's GPUs are in; None
    when a GPU has none (PCIe, NVLink within the node only, fabric manager not up) or
    the GPUs disagree (the fabric has not settled): IMEX needs the whole node in one."""
    domains = {g.nvlink_domain for g in inv.gpus}
    if len(domains) != 1:
        return None
    (only,) = domains
    return only if cd.is_fabric_clique(only) else None


def _driver(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return ()


def channel_slice(inv: Inventory, channels: int = cd.CHANNELS) -> tuple[SliceContent | None, str]:
    """The node's channel slice, or None and why not."""
    clique = node_clique(inv)
    if clique is None:
        return None, "the node's GPUs are not all in one multi-node NVLink fabric clique"
    if _driver(inv.driver_version) < MIN_DRIVER:
        return None, (
            f"driver {inv.driver_version} is older than "
            f"{'.'.join(map(str, MIN_DRIVER))}, the first with IMEX channels for containers"
        )
    devices = tuple(
        {
            "name": f"channel-{n}",
            "attributes": {
                "type": {"string": cd.CHANNEL_TYPE},
                "channel": {"int": n},
                "nvlinkDomain": {"string": clique},
            },
        }
        for n in range(channels)
    )
    return SliceContent(key=KEY, devices=devices), ""
