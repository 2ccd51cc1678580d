"""What each published device name means on this node. Derived from the very slices we
publish, so publishing and prepare can never disagree about a device."""

from __future__ import annotations

from dataclasses import dataclass

from dradriver.inventory.model import Gpu, Inventory, MigDevice, MigProfile
from dradriver.slices.build import BuildResult


@dataclass(frozen=True)
class LocalDevice:
    name: str
    kind: str  # "gpu" | "mig"
    gpu: Gpu
    uuid: str | None  # None for a MIG partition that is carved only at prepare
    mig: MigDevice | None = None  # an existing MIG device
    profile: MigProfile | None = None  # a partition (or existing MIG device) profile
    placement_start: int | None = None

    @property
    def memory_slices(self) -> frozenset[int]:
        """The GPU memory slices this device occupies (all 8 for a whole GPU)."""
        if self.kind == "gpu":
            return frozenset(range(8))
        if self.mig is not None:
            return frozenset(
                range(self.mig.placement_start, self.mig.placement_start + self.mig.placement_size)
            )
        assert self.profile is not None and self.placement_start is not None
        return frozenset(self.profile.memory_range(self.placement_start))

    def overlaps(self, other: LocalDevice) -> bool:
        """Two devices cannot be prepared for two claims at once if they share hardware."""
        if self.name == other.name:
            return True
        if self.gpu.uuid != other.gpu.uuid:
            return False
        return bool(self.memory_slices & other.memory_slices)


def index(inv: Inventory, built: BuildResult) -> dict[str, LocalDevice]:
    gpus = {g.uuid: g for g in inv.gpus}
    out: dict[str, LocalDevice] = {}
    for s in built.slices:
        for d in s.devices:
            attrs = d["attributes"]
            kind = attrs["type"]["string"]
            if kind == "gpu":
                gpu = gpus[attrs["uuid"]["string"]]
                out[d["name"]] = LocalDevice(d["name"], "gpu", gpu, gpu.uuid)
                continue
            gpu = gpus[attrs["parentUUID"]["string"]]
            profile = gpu.profile(attrs["profile"]["string"])
            start = int(attrs["placementStart"]["int"])
            uuid = attrs.get("uuid", {}).get("string")
            mig = next((m for m in gpu.mig_devices if m.uuid == uuid), None) if uuid else None
            out[d["name"]] = LocalDevice(d["name"], "mig", gpu, uuid, mig, profile, start)
    return out
