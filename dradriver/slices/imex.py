"""The IMEX channel device (pure): on a node whose GPUs are in one multi-node NVLink
fabric clique, one device `imex-channel` with the clique as its nvlinkDomain, in a slice
of its own (a GPU's slice is rebuilt on every MIG change; this one never changes while
the clique holds).

A ComputeDomain's claim template selects it in the domain's clique, so the job's claims
land on that clique's nodes, one a node (the device is allocated once, and a node is in
one IMEX domain at a time); prepare gives the container the domain's channel number,
/dev/nvidia-caps-imex-channels/channel<N> (api/computedomain.py says why one device).
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


def channel_slice(inv: Inventory, binding: bool = False) -> tuple[SliceContent | None, str]:
    """The node's channel slice, or None and why not. With `binding`, the device carries
    the binding conditions (api/computedomain.py): published only where the API server
    and the scheduler have the gates, since a scheduler without them never allocates a
    device that has any."""
    clique = node_clique(inv)
    if clique is None:
        return None, "the node's GPUs are not all in one multi-node NVLink fabric clique"
    if _driver(inv.driver_version) < MIN_DRIVER:
        return None, (
            f"driver {inv.driver_version} is older than "
            f"{'.'.join(map(str, MIN_DRIVER))}, the first with IMEX channels for containers"
        )
    device = {
        "name": cd.CHANNEL_DEVICE,
        "attributes": {
            "type": {"string": cd.CHANNEL_TYPE},
            "nvlinkDomain": {"string": clique},
        },
    }
    if binding:
        device["bindingConditions"] = [cd.BINDING_CONDITION]
        device["bindingFailureConditions"] = [cd.BINDING_FAILURE]
    return SliceContent(key=KEY, devices=(device,)), ""
