"""What NVML reports for each GPU product we fake: identity, memory, topology, MIG profiles.

Every number has its source beside it. The keys used:

- [G]   NVIDIA MIG User Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/
        mig-user-guide/supported-mig-profiles.html): fractions, engines, instance counts;
- [GS]  the same guide's "Getting Started with MIG" (-lgip/-lgipp/-cgi transcripts);
- [lgip:<source>] a real `nvidia-smi mig -lgip` (and -lgipp) transcript, named by where it
        was published (GitHub issue or PR, repository file);
- [smi:<source>] a real `nvidia-smi` / `nvidia-smi -q -x` capture (names, memory totals);
- [pci] NVIDIA/open-gpu-kernel-modules README, "Compatible GPUs" (PCI device IDs);
- [facts] /work/shared/reference/gpu-facts.md (nvidia-smi transcripts gathered earlier).

A value no public source gives is marked "derived:" with the rule it was derived by
(always from the same chip's published numbers). Memory in GiB as -lgip prints it; it moves
a little between driver releases (e.g. B200 1g: 22.00 in January 2025, 20.50 in March).

Brand: every product reports NVML_BRAND_NVIDIA, as `nvidia-smi -q` shows for L40S, T4,
B200 and GB200 ([smi:NVIDIA/k8s-test-infra tests/e2e/.../testdata/hardware]).
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

# The usual geometry: 8 memory slices (the placement axis) and 7 compute slices ([G],
# "Concepts": a memory slice is about 1/8 of the memory, an SM slice about 1/7 of the SMs).
# A30 has 4 and 4; RTX PRO 6000 places on a 12-unit grid with 4 compute slices.
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
class MigGeometry:
    """What a GPU has for its GPU instances to share: the placement grid, the compute
    slices, and its media engines. NVML refuses a layout that needs more than these."""

    memory_slices: int = MIG_MEMORY_SLICES  # placement units
    compute_slices: int = MIG_COMPUTE_SLICES
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


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
    geometry: MigGeometry = MigGeometry()  # of the product this profile belongs to

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
    # NVLink wiring of a group of this product when a spec does not say: "all" (NVSwitch
    # baseboard), "pairs" or "quads" (NVLink bridges of PCIe cards), "fabric" (multi-node
    # NVLink, e.g. GB200 NVL72), "none".
    default_nvlink: str = "none"

    @property
    def mig_capable(self) -> bool:
        return bool(self.gi_profiles)

    @property
    def row_remapping(self) -> bool:
        """Row remapping replaces page retirement from the A100 on, on the data-centre
        GPUs with HBM (NVIDIA's GPU memory error management guide,
        docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt); here: Ampere and newer
        MIG-capable products, which are those. Elsewhere nvmlDeviceGetRemappedRows
        answers NOT_SUPPORTED."""
        return self.mig_capable and self.architecture >= pynvml.NVML_DEVICE_ARCH_AMPERE

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


def _gib(gib: float) -> int:
    return round(gib * 1024)


_I = pynvml  # NVML_GPU_INSTANCE_PROFILE_* indices (what the profile-info call takes)
_EIGHT = {"1g": (0, 1, 2, 3, 4, 5, 6), "1g2": (0, 2, 4, 6), "2g": (0, 2, 4), "3g": (0, 4)}


@dataclass(frozen=True)
class _Row:
    """One line of `nvidia-smi mig -lgip` (+ its -lgipp placements)."""

    index: int
    id: int
    name: str
    compute_slices: int
    size: int  # placement size in memory slices
    starts: tuple[int, ...]
    instances: int
    memory_gib: float
    sms: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int


def _profiles(geometry: MigGeometry, rows: list[_Row]) -> tuple[GpuInstanceProfile, ...]:
    return tuple(
        GpuInstanceProfile(
            index=r.index,
            id=r.id,
            name=r.name,
            compute_slices=r.compute_slices,
            memory_slices=r.size,
            placement_starts=r.starts,
            instance_count=r.instances,
            multiprocessors=r.sms,
            copy_engines=r.ce,
            decoders=r.dec,
            encoders=r.enc,
            jpegs=r.jpeg,
            ofas=r.ofa,
            memory_mib=_gib(r.memory_gib),
            geometry=geometry,
        )
        for r in rows
    )


def _eight_slice(
    geometry: MigGeometry,
    names: tuple[str, str, str, str, str, str, str],
    memory: tuple[float, float, float, float, float],
    sms: tuple[int, int, int, int, int, int],
    engines: dict[str, tuple[int, int, int, int]],
) -> tuple[GpuInstanceProfile, ...]:
    """The 8-memory/7-compute-slice family (A100, H100, H200, B200, ...): IDs 19, 20, 15,
    14, 9, 5, 0 and their placements ([GS] -lgipp; [facts]).
    names: 1g, 1g+me, 1g (two memory slices), 2g, 3g, 4g, 7g; memory: 1g, 1g double, 2g,
    3g/4g, 7g (GiB); sms: 1g, 1g double, 2g, 3g, 4g, 7g; engines: kind -> (CE, DEC, JPEG,
    OFA), no encoders on these chips."""
    m1, m1d, m2, m3, m7 = memory
    s1, s1d, s2, s3, s4, s7 = sms
    spec = [
        ("1g", _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, names[0], 1, 1, _EIGHT["1g"], 7, m1, s1),
        (
            "1g+me",
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            20,
            names[1],
            1,
            1,
            _EIGHT["1g"],
            1,
            m1,
            s1,
        ),
        (
            "1g2",
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
            15,
            names[2],
            1,
            2,
            _EIGHT["1g2"],
            4,
            m1d,
            s1d,
        ),
        ("2g", _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, names[3], 2, 2, _EIGHT["2g"], 3, m2, s2),
        ("3g", _I.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, names[4], 3, 4, _EIGHT["3g"], 2, m3, s3),
        ("4g", _I.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, names[5], 4, 4, (0,), 1, m3, s4),
        ("7g", _I.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, names[6], 7, 8, (0,), 1, m7, s7),
    ]
    rows = []
    for kind, index, pid, name, cs, size, starts, count, mem, sm in spec:
        ce, dec, jpeg, ofa = engines[kind]
        rows.append(_Row(index, pid, name, cs, size, starts, count, mem, sm, ce, dec, 0, jpeg, ofa))
    return _profiles(geometry, rows)


# -- Ampere ---------------------------------------------------------------------------------

# GA100 engines per profile ([G] A100 table; [GS] -lgip): (CE, NVDEC, JPEG, OFA). The
# GPU's totals are the 7g instance's: 5 decoders, 1 JPEG, 1 OFA.
_GA100_ENGINES = {
    "1g": (1, 0, 0, 0),
    "1g+me": (1, 1, 1, 1),
    "1g2": (1, 1, 0, 0),
    "2g": (2, 1, 0, 0),
    "3g": (3, 2, 0, 0),
    "4g": (4, 2, 0, 0),
    "7g": (7, 5, 1, 1),
}
_GA100 = MigGeometry(decoders=5, jpegs=1, ofas=1)
_A100_SMS = (14, 14, 28, 42, 56, 98)  # [GS] -lgip A100-40GB; the 80GB part is the same chip

_A100_40GB_PROFILES = _eight_slice(
    _GA100,
    ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    (4.75, 9.625, 9.625, 19.5, 39.25),  # [GS] -lgip
    _A100_SMS,
    _GA100_ENGINES,
)
_A100_80GB_PROFILES = _eight_slice(
    _GA100,
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9.5, 19.5, 19.5, 39.25, 78.75),  # [facts]; [lgip:NVIDIA/mig-parted#97]
    _A100_SMS,
    _GA100_ENGINES,
)

# A30: 4 memory and 4 compute slices ([G] A30 table: fractions of 1/4); IDs, memory, SMs,
# engines and placements from a real -lgip/-lgipp on driver 535.183.01 (Summer-Lo/
# Docker_configuration 000-MIG/README.md, and the 2g+me row from a later transcript). The
# guide says 1g.6gb has 0 NVDECs; NVML reports 1, which is what the fake follows.
_A30 = MigGeometry(memory_slices=4, compute_slices=4, decoders=4, jpegs=1, ofas=1)
_A30_PROFILES = _profiles(
    _A30,
    [
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            14,
            "1g.6gb",
            1,
            1,
            (0, 1, 2, 3),
            4,
            5.81,
            14,
            1,
            1,
            0,
            0,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            21,
            "1g.6gb+me",
            1,
            1,
            (0, 1, 2, 3),
            1,
            5.81,
            14,
            1,
            1,
            0,
            1,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
            5,
            "2g.12gb",
            2,
            2,
            (0, 2),
            2,
            11.69,
            28,
            2,
            2,
            0,
            0,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
            6,
            "2g.12gb+me",
            2,
            2,
            (0, 2),
            1,
            11.69,
            28,
            2,
            2,
            0,
            1,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
            0,
            "4g.24gb",
            4,
            4,
            (0,),
            1,
            23.5,
            56,
            4,
            4,
            0,
            1,
            1,
        ),
    ],
)

# -- Hopper ---------------------------------------------------------------------------------

# GH100 engines ([G] H100/H200 tables; every Hopper -lgip below): (CE, NVDEC, JPEG, OFA).
# Totals: 7 decoders, 7 JPEG, 1 OFA (the 7g instance's).
_GH100_ENGINES = {
    "1g": (1, 1, 1, 0),
    "1g+me": (1, 1, 1, 1),
    "1g2": (1, 1, 1, 0),
    "2g": (2, 2, 2, 0),
    "3g": (3, 3, 3, 0),
    "4g": (4, 4, 4, 0),
    "7g": (8, 7, 7, 1),
}
_GH100 = MigGeometry(decoders=7, jpegs=7, ofas=1)
_H100_SMS = (16, 26, 32, 60, 64, 132)  # SXM parts ([lgip:jbarrow.ai field notes]; [facts])

_H100_80GB_PROFILES = _eight_slice(
    _GH100,
    ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9.75, 19.625, 19.625, 39.5, 79.25),  # [facts]; [lgip:jbarrow.ai field notes]
    _H100_SMS,
    _GH100_ENGINES,
)
# H100 NVL (94 GB): [lgip: "Configure and use MIG on Azure VM", Standard_NC40ads_H100_v5,
# driver 560.35.03; rows also in NVIDIA/gpu-operator#903 and mig-parted#101 (46.38)].
_H100_NVL_PROFILES = _eight_slice(
    _GH100,
    ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    (10.75, 21.62, 21.62, 46.38, 93.12),
    _H100_SMS,
    _GH100_ENGINES,
)
# H100 96GB, on GH200 ([G] "H100 96GB product"; [lgip:kf-cuanschutz/NVIDIA_Grace_Hopper_
# benchmarking_logs_ Daily_installs_loggings/Lessons_learned_from_the_slurm_MIG_installation.md]).
_GH200_96GB_PROFILES = _eight_slice(
    _GH100,
    ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    (11.0, 23.0, 23.0, 46.5, 93.0),
    _H100_SMS,
    _GH100_ENGINES,
)
# H200 141GB ([G] H200 table; [lgip:NVIDIA/mig-parted#120], a real H200).
_H200_PROFILES = _eight_slice(
    _GH100,
    ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    (16.0, 32.25, 32.25, 69.5, 139.75),
    _H100_SMS,
    _GH100_ENGINES,
)
# GH200 144GB HBM3e (H200 on GH200): 1g and 2g rows from [lgip:NVIDIA/mig-parted#139]; the
# 3g/4g/7g names and counts from NVIDIA/gpu-operator's default mig-parted config.
# derived: 3g/4g and 7g memory from H200's ratios to its 2g row (69.5/32.25, 139.75/32.25).
_GH200_144GB_PROFILES = _eight_slice(
    _GH100,
    ("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
    (17.5, 35.25, 35.25, 75.96, 152.75),
    _H100_SMS,
    _GH100_ENGINES,
)
# H20 (96 GB): profile names and counts from NVIDIA AI Enterprise "Hopper H20 vGPU Types"
# (MIG-backed types 1g.12gb ... 7g.96gb). derived: memory as the H100 96GB part (same
# memory, same geometry); SMs from H20's 78 SMs ([smi:torch get_device_properties]) by the
# guide's fractions of 1/7 per compute slice (1g double-memory like 1g).
_H20_PROFILES = _eight_slice(
    _GH100,
    ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    (11.0, 23.0, 23.0, 46.5, 93.0),
    (11, 11, 22, 33, 44, 78),
    _GH100_ENGINES,
)

# -- Blackwell ------------------------------------------------------------------------------

# GB100 (B200, GB200, B300): 1g, 1g double and 2g rows from real -lgip (below); CE per [G]
# B200 table (3g 6, 4g 8, 7g 16). The guide lists 1 NVDEC and 1 JPEG for every profile;
# NVML reports 2 for 2g (the transcripts), so per compute slice as on Hopper. derived: 3g,
# 4g, 7g decoders and JPEG at one per compute slice, OFA only on 7g and +me; the totals
# (7 each) are what seven 1g instances ([G]: 7 instances of 1g) use.
_GB100_ENGINES = {
    "1g": (2, 1, 1, 0),
    "1g+me": (2, 1, 1, 1),
    "1g2": (2, 1, 1, 0),
    "2g": (4, 2, 2, 0),
    "3g": (6, 3, 3, 0),
    "4g": (8, 4, 4, 0),
    "7g": (16, 7, 7, 1),
}
_GB100 = MigGeometry(decoders=7, jpegs=7, ofas=1)

# B200 180GB ([G] B200 table; [lgip:NVIDIA/mig-parted#166 and #187], 1g at 22.00 GiB in
# January 2025). derived: 3g/4g memory twice the 2g's and 7g four times (H100's ratios
# are 2.01 and 4.04); SMs of 3g/4g by H100's ratios to 2g (60/32, 64/32), 7g all 148
# ([smi:torch], B200).
_B200_PROFILES = _eight_slice(
    _GB100,
    ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    (22.0, 44.25, 44.25, 88.5, 177.0),
    (18, 30, 36, 67, 72, 148),
    _GB100_ENGINES,
)
# GB200 186GB: names as production boards print them since mid 2025 (1g.23gb; earlier
# drivers said 1g.24gb: NVIDIA/mig-parted#227, gpu-operator PRs #1303 and #1590); 1g,
# 1g double and 2g rows from [lgip:NVIDIA/mig-parted#227]. derived: the rest as for B200,
# 7g SMs 152 (test fixtures only: unverified).
_GB200_PROFILES = _eight_slice(
    _GB100,
    ("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
    (22.0, 45.5, 45.5, 91.0, 182.0),
    (18, 32, 38, 71, 76, 152),
    _GB100_ENGINES,
)
# B300 (HGX): names and counts from the GPU Operator 25.10 release notes ("new MIG
# profiles with NVIDIA HGX B300"); 1g.67gb has 30 SMs (kubernetes-sigs/dra-driver-nvidia-
# gpu#1454). derived: everything else from B200's pattern and B300's memory (275040 MiB).
_B300_PROFILES = _eight_slice(
    _GB100,
    ("1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
    (33.0, 66.5, 66.5, 133.0, 266.0),
    (18, 30, 36, 67, 72, 148),
    _GB100_ENGINES,
)

# RTX PRO 6000 Blackwell (GB202, 96 GB): the whole table with -lgipp placements on a
# 12-unit grid, driver 610.43.02 (blog "Slicing GPUs in Kubernetes with NVIDIA Multi-
# Instance GPU (MIG)"; rows 14/21/47 and 23.62 GiB also in GoogleCloudPlatform/container-
# engine-accelerators#564); engines as in [G] RTX PRO 6000 table. Suffixes, quoting [G]:
# "+me": "Include at least one media engine"; "+gfx": "Adds support for graphics APIs";
# "+me.all": "Allocates all available media engines to this instance"; "-me": "Excludes
# all media engines for pure compute workloads". The GPU has 4 NVDEC, 4 NVENC, 4 JPEG and
# 1 OFA (the 4g instance's), so a +me.all instance leaves no engine for a plain 1g or 2g.
_GB202 = MigGeometry(memory_slices=12, compute_slices=4, decoders=4, encoders=4, jpegs=4, ofas=1)
_Q, _H = (0, 3, 6, 9), (0, 6)
_RTX_PRO_6000_PROFILES = _profiles(
    _GB202,
    [
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            14,
            "1g.24gb",
            1,
            3,
            _Q,
            4,
            23.62,
            46,
            1,
            1,
            1,
            1,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            21,
            "1g.24gb+me",
            1,
            3,
            _Q,
            1,
            23.62,
            46,
            1,
            1,
            1,
            1,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX,
            47,
            "1g.24gb+gfx",
            1,
            3,
            _Q,
            4,
            23.62,
            46,
            1,
            1,
            1,
            1,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME,
            65,
            "1g.24gb+me.all",
            1,
            3,
            _Q,
            1,
            23.62,
            46,
            1,
            4,
            4,
            4,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME,
            67,
            "1g.24gb-me",
            1,
            3,
            _Q,
            4,
            23.62,
            46,
            1,
            0,
            0,
            0,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
            5,
            "2g.48gb",
            2,
            6,
            _H,
            2,
            47.38,
            94,
            2,
            2,
            2,
            2,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX,
            35,
            "2g.48gb+gfx",
            2,
            6,
            _H,
            2,
            47.38,
            94,
            2,
            2,
            2,
            2,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME,
            64,
            "2g.48gb+me.all",
            2,
            6,
            _H,
            1,
            47.38,
            94,
            2,
            4,
            4,
            4,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME,
            66,
            "2g.48gb-me",
            2,
            6,
            _H,
            2,
            47.38,
            94,
            2,
            0,
            0,
            0,
            0,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
            0,
            "4g.96gb",
            4,
            12,
            (0,),
            1,
            95.12,
            188,
            4,
            4,
            4,
            4,
            1,
        ),
        _Row(
            _I.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX,
            32,
            "4g.96gb+gfx",
            4,
            12,
            (0,),
            1,
            95.12,
            188,
            4,
            4,
            4,
            4,
            1,
        ),
    ],
)

# -- products -------------------------------------------------------------------------------

_BRAND = pynvml.NVML_BRAND_NVIDIA
_AMPERE = pynvml.NVML_DEVICE_ARCH_AMPERE
_ADA = pynvml.NVML_DEVICE_ARCH_ADA
_HOPPER = pynvml.NVML_DEVICE_ARCH_HOPPER
_BLACKWELL = pynvml.NVML_DEVICE_ARCH_BLACKWELL
_TURING = pynvml.NVML_DEVICE_ARCH_TURING
_NVLINK3, _NVLINK4 = pynvml.NVML_NVLINK_VERSION_3_0, pynvml.NVML_NVLINK_VERSION_4_0
_NVLINK5 = getattr(pynvml, "NVML_NVLINK_VERSION_5_0", _NVLINK4)
_NO_LINK = pynvml.NVML_NVLINK_VERSION_INVALID
_HOPPER_SWITCH = _pci(0x22A3)  # NVSwitch of HGX H100/H200 boards


def _product(**kw: object) -> Product:
    defaults: dict[str, object] = dict(
        brand=_BRAND,
        nvlink_links=0,
        nvlink_version=_NO_LINK,
        nvswitches=0,
        nvswitch_pci_device_id=0,
        mig_switch_without_reset=False,
    )
    return Product(**{**defaults, **kw})  # type: ignore[arg-type]


A100_40GB = _product(
    key="A100-40GB",
    name="NVIDIA A100-SXM4-40GB",
    memory_mib=40960,
    compute_capability=(8, 0),
    architecture=_AMPERE,
    multiprocessors=108,
    pci_device_id=_pci(0x20B0),
    pci_subsystem_id=0x134F10DE,
    nvlink_links=12,
    nvlink_version=_NVLINK3,
    nvswitches=6,
    nvswitch_pci_device_id=_pci(0x1AF1),
    gi_profiles=_A100_40GB_PROFILES,
    default_nvlink="all",
)
A100_80GB = _product(
    key="A100-80GB",
    name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    compute_capability=(8, 0),
    architecture=_AMPERE,
    multiprocessors=108,
    pci_device_id=_pci(0x20B2),
    pci_subsystem_id=0x147F10DE,
    nvlink_links=12,
    nvlink_version=_NVLINK3,
    nvswitches=6,
    nvswitch_pci_device_id=_pci(0x1AF1),
    gi_profiles=_A100_80GB_PROFILES,
    default_nvlink="all",
)
# [smi: "NVIDIA A30", 24576 MiB]; 56 SMs (the 4g instance's, above); [pci] 0x20B7.
A30 = _product(
    key="A30",
    name="NVIDIA A30",
    memory_mib=24576,
    compute_capability=(8, 0),
    architecture=_AMPERE,
    multiprocessors=56,
    pci_device_id=_pci(0x20B7),
    pci_subsystem_id=0x153210DE,
    nvlink_links=4,
    nvlink_version=_NVLINK3,
    gi_profiles=_A30_PROFILES,
)
H100_80GB = _product(
    key="H100-80GB",
    name="NVIDIA H100 80GB HBM3",
    memory_mib=81559,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x2330),
    pci_subsystem_id=0x16C110DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    nvswitches=4,
    nvswitch_pci_device_id=_HOPPER_SWITCH,
    mig_switch_without_reset=True,
    gi_profiles=_H100_80GB_PROFILES,
    default_nvlink="all",
)
# [smi: "NVIDIA H100 NVL", 95830 MiB]; [pci] 0x2321; PCIe cards joined in pairs by NVLink
# bridges.
H100_NVL = _product(
    key="H100-NVL",
    name="NVIDIA H100 NVL",
    memory_mib=95830,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x2321),
    pci_subsystem_id=0x183910DE,
    nvlink_links=12,
    nvlink_version=_NVLINK4,
    mig_switch_without_reset=True,
    gi_profiles=_H100_NVL_PROFILES,
    default_nvlink="pairs",
)
# GH200 with 96 GB HBM3: [smi: "NVIDIA GH200 480GB", 97871 MiB]; [pci] 0x2342.
GH200_96GB = _product(
    key="GH200-96GB",
    name="NVIDIA GH200 480GB",
    memory_mib=97871,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x2342),
    pci_subsystem_id=0x180910DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    mig_switch_without_reset=True,
    gi_profiles=_GH200_96GB_PROFILES,
    default_nvlink="fabric",
)
# GH200 with 144 GB HBM3e: name [pci, newer table]; 132 SMs (CUDA attribute); memory:
# derived from cuDeviceTotalMem (145920 MiB), nvidia-smi's total not published.
GH200_144GB = _product(
    key="GH200-144GB",
    name="NVIDIA GH200 144G HBM3e",
    memory_mib=145920,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x2348),
    pci_subsystem_id=0x18D210DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    mig_switch_without_reset=True,
    gi_profiles=_GH200_144GB_PROFILES,
    default_nvlink="fabric",
)
H200_141GB = _product(
    key="H200-141GB",
    name="NVIDIA H200",
    memory_mib=143771,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x2335),
    pci_subsystem_id=0x18BE10DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    nvswitches=4,
    nvswitch_pci_device_id=_HOPPER_SWITCH,
    mig_switch_without_reset=True,
    gi_profiles=_H200_PROFILES,
    default_nvlink="all",
)
# H200 NVL: [smi: "NVIDIA H200 NVL", 143771 MiB]; [pci] 0x233B; MIG as H200 141GB ([G]
# lists "H200 NVL 141GB", 7 instances; NVIDIA's default mig-parted config treats the two
# alike). PCIe cards joined by 2- or 4-way NVLink bridges: the fake wires groups of four.
H200_NVL = _product(
    key="H200-NVL",
    name="NVIDIA H200 NVL",
    memory_mib=143771,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=132,
    pci_device_id=_pci(0x233B),
    pci_subsystem_id=0x199610DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    mig_switch_without_reset=True,
    gi_profiles=_H200_PROFILES,
    default_nvlink="quads",
)
# H20: [smi: "NVIDIA H20", 97871 MiB, 78 SMs]; [pci] 0x2329.
H20 = _product(
    key="H20",
    name="NVIDIA H20",
    memory_mib=97871,
    compute_capability=(9, 0),
    architecture=_HOPPER,
    multiprocessors=78,
    pci_device_id=_pci(0x2329),
    pci_subsystem_id=0x198B10DE,
    nvlink_links=18,
    nvlink_version=_NVLINK4,
    nvswitches=4,
    nvswitch_pci_device_id=_HOPPER_SWITCH,
    mig_switch_without_reset=True,
    gi_profiles=_H20_PROFILES,
    default_nvlink="all",
)
# B200: [smi: NVIDIA/k8s-test-infra qx-b200.xml: "NVIDIA B200", 183359 MiB]; 148 SMs.
B200 = _product(
    key="B200",
    name="NVIDIA B200",
    memory_mib=183359,
    compute_capability=(10, 0),
    architecture=_BLACKWELL,
    multiprocessors=148,
    pci_device_id=_pci(0x2901),
    pci_subsystem_id=0x199910DE,
    nvlink_links=18,
    nvlink_version=_NVLINK5,
    nvswitches=2,
    nvswitch_pci_device_id=_HOPPER_SWITCH,
    mig_switch_without_reset=True,
    gi_profiles=_B200_PROFILES,
    default_nvlink="all",
)
# GB200: [smi: NVIDIA/k8s-test-infra qx-gb200.xml: "NVIDIA GB200", 189471 MiB, fabric
# Completed with a clusterUuid and cliqueId]: one NVL72 rack is one multi-node NVLink
# domain, so a group of GB200s shares a fabric clique by default.
GB200 = _product(
    key="GB200",
    name="NVIDIA GB200",
    memory_mib=189471,
    compute_capability=(10, 0),
    architecture=_BLACKWELL,
    multiprocessors=152,
    pci_device_id=_pci(0x2941),
    pci_subsystem_id=0x204610DE,
    nvlink_links=18,
    nvlink_version=_NVLINK5,
    mig_switch_without_reset=True,
    gi_profiles=_GB200_PROFILES,
    default_nvlink="fabric",
)
# B300: [smi: "NVIDIA B300 SXM6 AC", 275040 MiB]; [pci, newer table] 0x3182; compute
# capability 10.3 (third-party listings only). derived: 148 SMs, as B200.
B300 = _product(
    key="B300",
    name="NVIDIA B300 SXM6 AC",
    memory_mib=275040,
    compute_capability=(10, 3),
    architecture=_BLACKWELL,
    multiprocessors=148,
    pci_device_id=_pci(0x3182),
    pci_subsystem_id=0x20E610DE,
    nvlink_links=18,
    nvlink_version=_NVLINK5,
    nvswitches=2,
    nvswitch_pci_device_id=_HOPPER_SWITCH,
    mig_switch_without_reset=True,
    gi_profiles=_B300_PROFILES,
    default_nvlink="all",
)
# RTX PRO 6000 Blackwell Server Edition: [pci, newer table] name and 0x2BB5; [smi] 97887
# MiB; 188 SMs, compute capability 12.0 ([smi:torch]); no NVLink.
RTX_PRO_6000 = _product(
    key="RTX-PRO-6000",
    name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    memory_mib=97887,
    compute_capability=(12, 0),
    architecture=_BLACKWELL,
    multiprocessors=188,
    pci_device_id=_pci(0x2BB5),
    pci_subsystem_id=0x204E10DE,
    mig_switch_without_reset=True,
    gi_profiles=_RTX_PRO_6000_PROFILES,
)
# [smi: NVIDIA/k8s-test-infra qx-l40s.xml: "NVIDIA L40S", 46068 MiB with ECC]; 142 SMs;
# compute capability 8.9; no MIG.
L40S = _product(
    key="L40S",
    name="NVIDIA L40S",
    memory_mib=46068,
    compute_capability=(8, 9),
    architecture=_ADA,
    multiprocessors=142,
    pci_device_id=_pci(0x26B9),
    pci_subsystem_id=0x185110DE,
)
# [smi: "NVIDIA A10", 23028 MiB with ECC on]; 72 SMs (deviceQuery); [pci] 0x2236; no MIG.
A10 = _product(
    key="A10",
    name="NVIDIA A10",
    memory_mib=23028,
    compute_capability=(8, 6),
    architecture=_AMPERE,
    multiprocessors=72,
    pci_device_id=_pci(0x2236),
    pci_subsystem_id=0x148210DE,
)
L4 = _product(
    key="L4",
    name="NVIDIA L4",
    memory_mib=23034,
    compute_capability=(8, 9),
    architecture=_ADA,
    multiprocessors=58,
    pci_device_id=_pci(0x27B8),
    pci_subsystem_id=0x16CA10DE,
)
# [smi: NVIDIA/k8s-test-infra qx-t4.xml: "Tesla T4", 15360 MiB]; 40 SMs.
T4 = _product(
    key="T4",
    name="Tesla T4",
    memory_mib=15360,
    compute_capability=(7, 5),
    architecture=_TURING,
    multiprocessors=40,
    pci_device_id=_pci(0x1EB8),
    pci_subsystem_id=0x12A210DE,
)

PRODUCTS: dict[str, Product] = {
    p.key: p
    for p in (
        A100_40GB,
        A100_80GB,
        A30,
        H100_80GB,
        H100_NVL,
        GH200_96GB,
        GH200_144GB,
        H200_141GB,
        H200_NVL,
        H20,
        B200,
        GB200,
        B300,
        RTX_PRO_6000,
        L40S,
        A10,
        L4,
        T4,
    )
}


def product(key: str) -> Product | None:
    """Case-insensitive lookup by spec name ("h100-80gb" -> H100_80GB)."""
    return next((p for k, p in PRODUCTS.items() if k.lower() == key.lower()), None)
