"""The fixed facts of a fake machine: identities, PCI addresses, NUMA nodes, NVLink wiring.

Everything is derived from the node name and a GPU's slot (its group, product and place
in the group), never from its NVML index: the same spec on the same node always describes
the same hardware, another product in a slot is another GPU, and a GPU missing from its
slot (`absent=`) shifts the later GPUs' NVML indices but no one's identity.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pynvml

from fakenvml.products import Product
from fakenvml.spec import MachineSpec, NvLink

# Bus numbers of the 8 GPUs on an HGX H100 board; larger machines repeat the pattern a
# few buses further on.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_FIRST_SWITCH_BUS = 0x04
_SWITCH_BUSES_PER_DOMAIN = 0x14  # 0x04..0x17, below the first GPU


def _uuid_text(digest: bytes) -> str:
    h = digest[:16].hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_uuid(node: str, group: int, product: str, slot: int) -> str:
    key = f"gpu/{node}/{group}/{product}/{slot}"
    return "GPU-" + _uuid_text(hashlib.sha256(key.encode()).digest())


def mig_uuid(parent_uuid: str, gi: int, ci: int, serial: int) -> str:
    """Fresh for every compute instance created (serial counts them), like a real one."""
    key = f"mig/{parent_uuid}/{gi}/{ci}/{serial}"
    return "MIG-" + _uuid_text(hashlib.sha256(key.encode()).digest())


@dataclass(frozen=True)
class PciAddress:
    domain: int
    bus: int

    @property
    def bus_id(self) -> str:
        return f"{self.domain:08X}:{self.bus:02X}:00.0"

    @property
    def legacy_bus_id(self) -> str:
        return f"{self.domain:04X}:{self.bus:02X}:00.0"


@dataclass(frozen=True)
class LinkEnd:
    """What an NVLink of a GPU connects to."""

    pci: PciAddress
    pci_device_id: int
    pci_subsystem_id: int
    device_type: int  # NVML_NVLINK_DEVICE_TYPE_GPU or _SWITCH


@dataclass(frozen=True)
class GpuLayout:
    index: int  # NVML's: counts only the GPUs present
    minor: int  # the machine-wide slot: /dev/nvidia<minor>, kept when a GPU before it is gone
    group: int
    product: Product
    uuid: str
    pci: PciAddress
    numa_node: int
    links: tuple[LinkEnd, ...]  # empty: no NVLink
    fabric: tuple[bytes, int] | None  # (clusterUuid, cliqueId) when the fabric is up


def gpu_pci(index: int) -> PciAddress:
    return PciAddress(0, _HGX_BUSES[index % 8] + 2 * (index // 8))


def build(spec: MachineSpec, node: str) -> list[GpuLayout]:
    out: list[GpuLayout] = []
    total = spec.slot_count
    switches_used = 0
    first = 0  # the group's first machine-wide slot
    for g, group in enumerate(spec.groups):
        p = group.product
        switch_ends: tuple[LinkEnd, ...] = ()
        if group.nvlink in (NvLink.ALL, NvLink.FABRIC):
            ends = []
            for _ in range(p.nvswitches):
                k = switches_used
                switches_used += 1
                pci = PciAddress(
                    k // _SWITCH_BUSES_PER_DOMAIN,
                    _FIRST_SWITCH_BUS + k % _SWITCH_BUSES_PER_DOMAIN,
                )
                ends.append(
                    LinkEnd(pci, p.nvswitch_pci_device_id, 0, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                )
            switch_ends = tuple(ends)
        fabric = None
        if group.nvlink is NvLink.FABRIC:
            cluster = group.cluster or f"{node}/group{g}"
            digest = hashlib.sha256(f"cluster/{cluster}".encode()).digest()[:16]
            fabric = (digest, group.clique if group.clique is not None else 1)
        for local in group.present:
            slot = first + local
            links: tuple[LinkEnd, ...] = ()
            if group.nvlink.bridge_size:
                # A bridge joins k cards; each card's links are shared among its peers
                # (a missing peer's links end nowhere, so NVML does not report them).
                k = group.nvlink.bridge_size
                base = local - local % k
                peers = [
                    LinkEnd(
                        gpu_pci(first + base + j),
                        p.pci_device_id,
                        p.pci_subsystem_id,
                        pynvml.NVML_NVLINK_DEVICE_TYPE_GPU,
                    )
                    for j in range(k)
                    if base + j != local and base + j not in group.absent
                ]
                if peers:
                    links = tuple(peers[n % len(peers)] for n in range(p.nvlink_links))
            elif switch_ends:
                links = tuple(switch_ends[n % len(switch_ends)] for n in range(p.nvlink_links))
            out.append(
                GpuLayout(
                    index=len(out),
                    minor=slot,
                    group=g,
                    product=p,
                    uuid=gpu_uuid(node, g, p.key, local),
                    pci=gpu_pci(slot),
                    numa_node=slot * 2 // total,
                    links=links,
                    fabric=fabric,
                )
            )
        first += group.count
    return out
