"""What NVML reports for each GPU product we fake: identity, memory, topology, MIG profiles.

Numbers come from /work/shared/reference/gpu-facts.md (nvidia-smi transcripts). Where that
table gives only some of a profile's numbers, the rest follow the same chip's pattern; each
such gap is marked "filled" below.

Brand: every product reports NVML_BRAND_NVIDIA. Drivers since R510 report datacenter parts
(including T4, once "Tesla") with that brand; picking one keeps inventories comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

# Every MIG-capable product here shares one geometry: 8 memory slices (the placement
# axis) and 7 compute slices.
MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7

_NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class ComputeInstanceProfile:
    """A compute-instance profile inside a GPU instance; its NVML ID equals its index."""

    index: int  # NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE
    slices: int

    @property
    def id(self) -> int:
        return self.index


CI_PROFILES: dict[int, ComputeInstanceProfile] = {
    p.index: p
    for p in (
        ComputeInstanceProfile(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 1),
        ComputeInstanceProfile(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 2),
        ComputeInstanceProfile(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 3),
        ComputeInstanceProfile(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, 4),
        ComputeInstanceProfile(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, 7),
    )
}
_FULL_CI_BY_SLICES = {p.slices: p for p in CI_PROFILES.values()}


@dataclass(frozen=True)
class GpuInstanceProfile:
    index: int  # NVML_GPU_INSTANCE_PROFILE_* (what the profile-info call takes)
    id: int  # profile ID (what placement and create calls take)
    name: str  # "3g.40gb", as nvidia-smi prints it without the "MIG " prefix
    compute_slices: int
    memory_slices: int  # placement size
    placement_starts: tuple[int, ...]
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    memory_mib: int
    media_extensions: bool = False  # "+me": takes the GPU's one set of spare media engines

    @property
    def full_ci_profile(self) -> ComputeInstanceProfile:
        """A MIG device is a GPU instance plus one compute instance of this profile."""
        return _FULL_CI_BY_SLICES[self.compute_slices]


@dataclass(frozen=True)
class Product:
    key: str  # the name `fake:` specs use, e.g. "H100-80GB"
    name: str  # nvmlDeviceGetName
    memory_mib: int
    compute_capability: tuple[int, int]
    architecture: int  # NVML_DEVICE_ARCH_*
    brand: int  # NVML_BRAND_*
    multiprocessors: int
    pci_device_id: int  # NVML layout: device << 16 | vendor
    pci_subsystem_id: int  # representative board values
    nvlink_links: int
    nvlink_version: int  # NVML_NVLINK_VERSION_*
    nvswitches: int  # NVSwitch chips on this product's HGX baseboard
    nvswitch_pci_device_id: int
    mig_switch_without_reset: bool  # Hopper and newer
    gi_profiles: tuple[GpuInstanceProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.gi_profiles)

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_links > 0

    def gi_profile_by_index(self, index: int) -> GpuInstanceProfile | None:
        return next((p for p in self.gi_profiles if p.index == index), None)

    def gi_profile_by_id(self, profile_id: int) -> GpuInstanceProfile | None:
        return next((p for p in self.gi_profiles if p.id == profile_id), None)

    def gi_profile_by_name(self, name: str) -> GpuInstanceProfile | None:
        return next((p for p in self.gi_profiles if p.name == name.lower()), None)


def _pci(device: int) -> int:
    return device << 16 | _NVIDIA_VENDOR


_P1 = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
_P1_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
_P1_DOUBLE = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
_P2 = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
_P3 = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
_P4 = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
_P7 = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE

# (index, id, compute slices, memory slices, placement starts, instance count); the
# geometry is the same on every product here.
_GEOMETRY = {
    "1g": (_P1, 19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    "1g+me": (_P1_ME, 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g-double": (_P1_DOUBLE, 15, 1, 2, (0, 2, 4, 6), 4),
    "2g": (_P2, 14, 2, 2, (0, 2, 4), 3),
    "3g": (_P3, 9, 3, 4, (0, 4), 2),
    "4g": (_P4, 5, 4, 4, (0,), 1),
    "7g": (_P7, 0, 7, 8, (0,), 1),
}


def _gi(
    kind: str, name: str, sms: int, engines: tuple[int, int, int, int], memory_mib: int
) -> GpuInstanceProfile:
    """engines: copy engines, decoders, JPEG, OFA (A100 and H100 have no NVENC)."""
    index, pid, cs, ms, starts, count = _GEOMETRY[kind]
    ce, dec, jpeg, ofa = engines
    return GpuInstanceProfile(
        index=index,
        id=pid,
        name=name,
        compute_slices=cs,
        memory_slices=ms,
        placement_starts=starts,
        instance_count=count,
        multiprocessors=sms,
        copy_engines=ce,
        decoders=dec,
        encoders=0,
        jpegs=jpeg,
        ofas=ofa,
        memory_mib=memory_mib,
        media_extensions=kind == "1g+me",
    )


def _gib(gib: float) -> int:
    return round(gib * 1024)


# GA100: the facts give A100-40GB's engine counts; A100-80GB is the same chip (filled).
_A100_ENGINES = {
    "1g": (1, 0, 0, 0),
    "1g+me": (1, 1, 1, 1),
    "1g-double": (1, 1, 0, 0),
    "2g": (2, 1, 0, 0),
    "3g": (3, 2, 0, 0),
    "4g": (4, 2, 0, 0),
    "7g": (7, 5, 1, 1),
}
# GH100: the facts give H100's engine counts; H200 is the same chip (filled).
_HOPPER_ENGINES = {
    "1g": (1, 1, 1, 0),
    "1g+me": (1, 1, 1, 1),
    "1g-double": (1, 1, 1, 0),
    "2g": (2, 2, 2, 0),
    "3g": (3, 3, 3, 0),
    "4g": (4, 4, 4, 0),
    "7g": (8, 7, 7, 1),
}
_A100_SMS = {"1g": 14, "1g+me": 14, "1g-double": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
# H200's 1g double-memory SM count is not in the facts: filled from H100 (same chip).
_HOPPER_SMS = {"1g": 16, "1g+me": 16, "1g-double": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}


def _profiles(
    names: dict[str, str],
    memory_gib: dict[str, float],
    sms: dict[str, int],
    engines: dict[str, tuple[int, int, int, int]],
) -> tuple[GpuInstanceProfile, ...]:
    return tuple(
        _gi(kind, names[kind], sms[kind], engines[kind], _gib(memory_gib[kind]))
        for kind in _GEOMETRY
    )


_A100_40GB_PROFILES = _profiles(
    {
        "1g": "1g.5gb",
        "1g+me": "1g.5gb+me",
        "1g-double": "1g.10gb",
        "2g": "2g.10gb",
        "3g": "3g.20gb",
        "4g": "4g.20gb",
        "7g": "7g.40gb",
    },
    {
        "1g": 4.75,
        "1g+me": 4.75,  # filled: a 1g+me instance has the 1g memory
        "1g-double": 9.625,
        "2g": 9.625,
        "3g": 19.5,
        "4g": 19.5,
        "7g": 39.25,
    },
    _A100_SMS,
    _A100_ENGINES,
)

_A100_80GB_PROFILES = _profiles(
    {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g-double": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    {
        "1g": 9.5,
        "1g+me": 9.5,  # filled
        "1g-double": 19.5,
        "2g": 19.5,
        "3g": 39.25,
        "4g": 39.25,
        "7g": 78.75,
    },
    _A100_SMS,
    _A100_ENGINES,
)

_H100_80GB_PROFILES = _profiles(
    {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g-double": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    {
        "1g": 9.75,
        "1g+me": 9.75,  # filled
        "1g-double": 19.625,
        "2g": 19.625,
        "3g": 39.5,
        "4g": 39.5,
        "7g": 79.25,
    },
    _HOPPER_SMS,
    _HOPPER_ENGINES,
)

_H200_PROFILES = _profiles(
    {
        "1g": "1g.18gb",
        "1g+me": "1g.18gb+me",
        "1g-double": "1g.35gb",
        "2g": "2g.35gb",
        "3g": "3g.71gb",
        "4g": "4g.71gb",
        "7g": "7g.141gb",
    },
    {
        "1g": 16.0,
        "1g+me": 16.0,  # filled
        "1g-double": 32.5,
        "2g": 32.5,
        # filled: H100's 4-slice/2-slice ratio (2.01) applied to H200's 32.5 GiB, below
        # half of the 7g instance (70 GiB) as on every other product.
        "3g": 65.5,
        "4g": 65.5,
        "7g": 140.0,
    },
    _HOPPER_SMS,
    _HOPPER_ENGINES,
)

_BRAND = pynvml.NVML_BRAND_NVIDIA
_AMPERE = pynvml.NVML_DEVICE_ARCH_AMPERE
_ADA = pynvml.NVML_DEVICE_ARCH_ADA
_HOPPER = pynvml.NVML_DEVICE_ARCH_HOPPER
_TURING = pynvml.NVML_DEVICE_ARCH_TURING

A100_40GB = Product(
    key="A100-40GB",
    name="NVIDIA A100-SXM4-40GB",
    memory_mib=40960,
    compute_capability=(8, 0),
    architecture=_AMPERE,
    brand=_BRAND,
    multiprocessors=108,
    pci_device_id=_pci(0x20B0),
    pci_subsystem_id=0x134F10DE,
    nvlink_links=12,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_3_0,
    nvswitches=6,
    nvswitch_pci_device_id=_pci(0x1AF1),
    mig_switch_without_reset=False,
    gi_profiles=_A100_40GB_PROFILES,
)
A100_80GB = Product(
    key="A100-80GB",
    name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    compute_capability=(8, 0),
    architecture=_AMPERE,
    brand=_BRAND,
    multiprocessors=108,
    pci_device_id=_pci(0x20B2),
    pci_subsystem_id=0x147F10DE,
    nvlink_links=12,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_3_0,
    nvswitches=6,
    nvswitch_pci_device_id=_pci(0x1AF1),
    mig_switch_without_reset=False,
    gi_profiles=_A100_80GB_PROFILES,
)
H100_80GB = Product(
    key="H100-80GB",
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    brand=_BRAND,
    multiprocessors=132,
    pci_device_id=_pci(0x2330),
    pci_subsystem_id=0x16C110DE,
    nvlink_links=18,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_4_0,
    nvswitches=4,
    nvswitch_pci_device_id=_pci(0x22A3),
    mig_switch_without_reset=True,
    gi_profiles=_H100_80GB_PROFILES,
)
H200_141GB = Product(
    key="H200-141GB",
    name="NVIDIA H200",
    memory_mib=143771,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    brand=_BRAND,
    multiprocessors=132,
    pci_device_id=_pci(0x2335),
    pci_subsystem_id=0x18BE10DE,
    nvlink_links=18,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_4_0,
    nvswitches=4,
    nvswitch_pci_device_id=_pci(0x22A3),
    mig_switch_without_reset=True,
    gi_profiles=_H200_PROFILES,
)
L4 = Product(
    key="L4",
    name="NVIDIA L4",
    memory_mib=23034,
    compute_capability=(8, 9),
    architecture=_ADA,
    brand=_BRAND,
    multiprocessors=58,
    pci_device_id=_pci(0x27B8),
    pci_subsystem_id=0x16CA10DE,
    nvlink_links=0,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_INVALID,
    nvswitches=0,
    nvswitch_pci_device_id=0,
    mig_switch_without_reset=False,
)
T4 = Product(
    key="T4",
    name="Tesla T4",
    memory_mib=15360,
    compute_capability=(7, 5),
    architecture=_TURING,
    brand=_BRAND,
    multiprocessors=40,
    pci_device_id=_pci(0x1EB8),
    pci_subsystem_id=0x12A210DE,
    nvlink_links=0,
    nvlink_version=pynvml.NVML_NVLINK_VERSION_INVALID,
    nvswitches=0,
    nvswitch_pci_device_id=0,
    mig_switch_without_reset=False,
)

PRODUCTS: dict[str, Product] = {
    p.key: p for p in (A100_40GB, A100_80GB, H100_80GB, H200_141GB, L4, T4)
}


def product(key: str) -> Product | None:
    """Case-insensitive lookup by spec name ("h100-80gb" -> H100_80GB)."""
    return next((p for k, p in PRODUCTS.items() if k.lower() == key.lower()), None)
