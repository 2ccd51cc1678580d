"""Device names that follow the GPU, not its place in NVML's enumeration.

NVML documents its index order as unstable across reboots, and a GPU that falls off the
bus shifts every index after it; minor numbers are assigned at boot in probe order, so
they shift too once such a node reboots; a PCI bus ID names a slot, and a board swapped
into it would inherit the name (and an allocation made for the old board). An allocation
names a device, so the name must name the physical GPU: it is taken from the GPU's UUID,
which NVIDIA burns into the board. `gpu-9b3c2810` is the first group of
`GPU-9b3c2810-...`, what `nvidia-smi -L` prints, so a user finds the card from the name.

Eight hex digits tell apart the GPUs of one node unless two UUIDs share them (about 1 in
600 million for 8 GPUs); then those GPUs, and only they, get longer prefixes, so a name
is unique on its node and never longer than a DNS label allows (`gpu-` + 32 + the MIG
suffix stays under 63).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from dradriver.inventory.model import Gpu

GPU_PREFIX = "gpu-"
_LENGTHS = (8, 12, 16, 32)


def uuid_digits(uuid: str) -> str:
    """The UUID's identifying characters, lower case: "GPU-9B3C2810-F437-..." ->
    "9b3c2810f437..." (NVML's own UUIDs are hex; anything else keeps its [a-z0-9])."""
    body = uuid.removeprefix("GPU-").removeprefix("gpu-")
    return re.sub(r"[^a-z0-9]", "", body.lower())


def stable_names(uuids: Iterable[str]) -> dict[str, str]:
    """UUID -> device name, unique among `uuids`: the shortest prefix of _LENGTHS that
    no other GPU of the node shares."""
    digits = {u: uuid_digits(u) for u in uuids}
    out: dict[str, str] = {}
    for uuid, d in digits.items():
        for n in _LENGTHS:
            if all(o[:n] != d[:n] for u, o in digits.items() if u != uuid):
                break
        out[uuid] = GPU_PREFIX + (d[:n] or "unknown")
    return out


def default_name(uuid: str) -> str:
    """The name a GPU gets when no other GPU of its node shares its first 8 digits."""
    return GPU_PREFIX + (uuid_digits(uuid)[: _LENGTHS[0]] or "unknown")


@dataclass(frozen=True)
class GpuIdentity:
    """The GPU a device name was published for."""

    uuid: str
    pci_bus_id: str = ""
    product: str = ""

    def describe(self) -> str:
        facts = ", ".join(x for x in (self.product, self.pci_bus_id) if x)
        return f"{self.uuid} ({facts})" if facts else self.uuid

    @classmethod
    def of(cls, gpu: Gpu) -> GpuIdentity:
        return cls(gpu.uuid, gpu.pci_bus_id, gpu.product_name)
