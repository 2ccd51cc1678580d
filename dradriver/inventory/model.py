"""The inventory model every other part reads: discovery fills it, slices are built
from it, prepare checks against it. Plain frozen values, so it can be compared,
hashed into slice fingerprints and written as JSON without ceremony."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile as NVML reports it for one GPU."""

    profile_id: int  # NVML's profile *ID* (1g=19, 3g=9, ...), not the profile index
    name: str  # "1g.10gb", "1g.10gb+me"
    compute_slices: int
    memory_slices: int  # the placement size, in units of the GPU's placement grid
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[int, ...]  # possible placement starts
    instance_count: int

    def memory_range(self, start: int) -> range:
        return range(start, start + self.memory_slices)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device that exists: one compute instance of a GPU instance. A GPU instance
    may hold several compute instances (`nvidia-smi mig -cci 0,0,0 -gi 1`); each is a MIG
    device of its own, sharing the GPU instance's memory."""

    uuid: str
    parent_uuid: str
    profile: str  # the GPU instance's profile, "3g.40gb"
    profile_id: int
    placement_start: int
    placement_size: int
    gpu_instance_id: int
    compute_instance_id: int
    memory_bytes: int
    multiprocessors: int
    # Compute slices of this compute instance and of its GPU instance (equal for the
    # usual one full-size compute instance per GPU instance); 0 when NVML did not say.
    compute_slices: int = 0
    gpu_instance_slices: int = 0
    # How many compute instances its GPU instance holds.
    siblings: int = 1

    @property
    def partial(self) -> bool:
        """A compute instance smaller than its GPU instance."""
        return 0 < self.compute_slices < self.gpu_instance_slices

    @property
    def device_profile(self) -> str:
        """As nvidia-smi names the MIG device: "3g.40gb", or "1c.3g.40gb" for a 1-slice
        compute instance of a 3g.40gb GPU instance."""
        return f"{self.compute_slices}c.{self.profile}" if self.partial else self.profile


@dataclass(frozen=True)
class IdleGpuInstance:
    """A GPU instance with no compute instance: no usable MIG device, but its memory
    slices (and engines) are taken until someone destroys it."""

    profile: str
    profile_id: int
    placement_start: int
    placement_size: int
    gpu_instance_id: int


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    product_name: str
    memory_bytes: int
    pci_bus_id: str  # "0000:18:00.0", as sysfs and resource.kubernetes.io/pciBusID spell it
    cuda_compute_capability: str  # semver, "9.0.0"
    architecture: str  # "Hopper"
    brand: str  # "Nvidia"
    multiprocessors: int | None = None
    pcie_root: str | None = None  # "pci0000:00"
    numa_node: int | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    # Hopper and newer switch MIG mode on demand; Ampere needs it enabled (and a reset)
    # before any partition can be carved.
    mig_switchable: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
    idle_gpu_instances: tuple[IdleGpuInstance, ...] = ()
    nvlink_domain: str | None = None
    # The device name, from the UUID (inventory.naming); discovery sets it so that two
    # GPUs of one node whose UUIDs share a prefix still get distinct names.
    name: str = ""

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@dataclass(frozen=True)
class Inventory:
    driver_version: str  # strict semver
    cuda_driver_version: str  # strict semver
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    # As NVML says it ("580.95.05"): the driver's files are named with it (libcuda.so.580.95.05).
    driver_release: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def gpu(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)
