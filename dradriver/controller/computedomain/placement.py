"""Where a ComputeDomain goes (pure): a fabric clique with spec.numNodes nodes that host
no other domain, and an IMEX channel number no other domain of that clique holds.

A clique is chosen once, when the domain's template is made, because the template's
selector is what keeps every claim of the job inside it: claims are made per pod, and
the scheduler allocates each on its own, so nothing else would stop the second pod from
landing on a node of another rack. Best fit: of the cliques with room, the one with the
fewest free nodes, so a large clique stays whole for a large job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.api import computedomain as cd
from dradriver.controller.computedomain.records import Domain, Fleet


@dataclass(frozen=True)
class Placement:
    clique: str
    channel: int


@dataclass(frozen=True)
class NoRoom:
    reason: str  # a condition reason
    message: str


def node_cliques(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, str]:
    """node -> its fabric clique, from the IMEX channel devices of `driver`'s
    ResourceSlices (their nvlinkDomain attribute): a node that publishes none cannot
    prepare a domain's channel (no clique, a driver without channels, or channels off),
    so it is no place for a domain. One that names two cliques is left out too."""
    seen: dict[str, set[str]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver or not isinstance(node, str) or not node:
            continue
        for d in spec.get("devices") or []:
            attrs = (d or {}).get("attributes") or {}
            if (attrs.get("type") or {}).get("string") != cd.CHANNEL_TYPE:
                continue
            dom = (attrs.get("nvlinkDomain") or {}).get("string")
            if isinstance(dom, str) and cd.is_fabric_clique(dom):
                seen.setdefault(node, set()).add(dom)
    return {n: next(iter(c)) for n, c in seen.items() if len(c) == 1}


def free_channel(taken: Iterable[int], channels: int = cd.CHANNELS) -> int | None:
    """The lowest channel number not taken."""
    used = set(taken)
    return next((c for c in range(channels) if c not in used), None)


def place(domain: Domain, fleet: Fleet) -> Placement | NoRoom:
    """A clique and channel for `domain`, or why there is none."""
    free: dict[str, list[str]] = {}
    for node, clique in fleet.cliques.items():
        if fleet.hosting.get(node, domain.uid) == domain.uid:
            free.setdefault(clique, []).append(node)
    if not fleet.cliques:
        return NoRoom(
            "NoFabricClique",
            "no node publishes IMEX channels (GB200 NVL72 and GH200 NVL32 nodes do once "
            "their fabric manager is up, on driver 570.158.01 or later, with the kubelet "
            "plugin's --imex-channels on): check `dradriver devices` on the nodes",
        )
    fits = sorted(
        (len(nodes), clique)
        for clique, nodes in free.items()
        if len(nodes) >= domain.num_nodes
        and free_channel(fleet.taken(clique, domain.uid)) is not None
    )
    if not fits:
        sizes = ", ".join(
            f"{c}: {len(free.get(c, []))} of {len(fleet.nodes_of(c))} free"
            for c in sorted(set(fleet.cliques.values()))
        )
        return NoRoom(
            "NoCliqueWithRoom",
            f"spec.numNodes is {domain.num_nodes}, but no fabric clique has that many "
            f"nodes free of other ComputeDomains ({sizes}); it is placed once another "
            "domain is deleted or nodes join a clique",
        )
    clique = fits[0][1]
    channel = free_channel(fleet.taken(clique, domain.uid))
    assert channel is not None  # fits checked it
    return Placement(clique, channel)
