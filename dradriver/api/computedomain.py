"""The ComputeDomain API, computedomains.gpu.dradriver.io/v1alpha1: one multi-node NVLink
(IMEX) domain for one job. Its schema and validation rules live in the CRD
(deploy/helm/dradriver/crds/computedomains.gpu.dradriver.io.yaml); these are the names
the controller, the kubelet plugin and the tools share with it.

    apiVersion: gpu.dradriver.io/v1alpha1
    kind: ComputeDomain
    metadata: {name: training, namespace: team}
    spec:                                   # immutable
      numNodes: 2                           # nodes the job's pods run on, one pod each
      channel:
        resourceClaimTemplate:
          name: training-channel            # made and owned by the controller
    status:
      clique: <clusterUuid>.<cliqueId>      # the fabric clique chosen for the domain
      channel: 0                            # its IMEX channel, the same on every node
      nodes: [{name, clique, address, ready}]
      conditions: [{type: Ready, ...}]
"""

from __future__ import annotations

import re

GROUP = "gpu.dradriver.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ComputeDomain"
PLURAL = "computedomains"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Held on a domain until its template is gone and no claim of it is still in use.
FINALIZER = f"{GROUP}/computedomain"
# On the template and on every claim made from it: which domain (its uid) they serve,
# so the controller finds them by label selector instead of reading every claim.
DOMAIN_LABEL = f"{GROUP}/computedomain-uid"
# On the template: the placement the controller chose, kept where it survives a lost
# status (the template's selector enforces it; these say it without parsing CEL).
CLIQUE_ANNOTATION = f"{GROUP}/clique"
CHANNEL_ANNOTATION = f"{GROUP}/channel"

# The DeviceClass of IMEX channel devices, and their type attribute.
CHANNEL_CLASS = "imex-channel.dradriver.io"
CHANNEL_TYPE = "imex-channel"
CHANNEL_REQUEST = "channel"
# Each node publishes one channel device: a node is in one IMEX domain at a time (one
# IMEX daemon a node), so one allocation of it is all a node can give, and the
# scheduler then keeps a second domain (or a second pod of the same one) off the node.
# Its channel number is the domain's, chosen by the controller among the driver's 2048
# (0..2047) and injected at prepare. One device, not one per number: with 128 of them
# a node, the scheduler evaluated every GPU claim's class against each (200 GB200
# trays: 85 ms of Filter a pod against 6 ms; with one, 11 against 12: benchmarks/).
CHANNEL_DEVICE = "imex-channel"
CHANNELS = 2048

# A multi-node NVLink fabric clique as dradriver's nvlinkDomain attribute spells it,
# `<clusterUuid>.<cliqueId>`; an NVLink domain within one node is `nvlink-<hash>`.
FABRIC_CLIQUE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[0-9]{1,10}"
)


def is_fabric_clique(domain: str | None) -> bool:
    return domain is not None and FABRIC_CLIQUE.fullmatch(domain) is not None


# The node label naming its fabric clique, for a job's podAffinity topologyKey.
NVLINK_DOMAIN_LABEL = f"{GROUP}/nvlink-domain"

# A node's address for its peers' IMEX daemons, where the IMEX network is not the one
# its InternalIP is on (the kubelet's --node-labels, or by hand); an IPv4 or IPv6 address.
IMEX_ADDRESS_LABEL = f"{GROUP}/imex-address"

READY = "Ready"

# Device binding conditions (KEP-5007, alpha in 1.34: gates DRADeviceBindingConditions
# and DRAResourceClaimDeviceStatus): the channel device names these, so the scheduler
# holds a pod's binding until the node's plugin sets the first True in the claim's
# status.devices (its IMEX daemon answers READY), and gives the node up when it sets the
# second (the daemon cannot get ready there).
BINDING_CONDITION = "IMEXDaemonReady"
BINDING_FAILURE = "IMEXDaemonFailed"


def ip_address(value: object) -> str | None:
    """`value` as an IPv4 or IPv6 address, or None: what may go into an IMEX daemon's
    nodes_config, one address a line. Not one with a zone ("fe80::1%eth0"): a zone names
    an interface of one host, means nothing to its peers, and ipaddress takes any text in
    it, a newline included."""
    import ipaddress

    if not isinstance(value, str):
        return None
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return None
    return str(ip)
