"""GPU discovery through NVML: the real pynvml module on a node, or a private copy wired
to the fake NVML library in tests and demos. The same code runs on both, which is the
point: only the C library underneath differs."""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from dradriver.inventory.model import Gpu, IdleGpuInstance, Inventory, MigDevice, MigProfile
from dradriver.inventory.naming import stable_names
from dradriver.inventory.versions import compute_capability, cuda_version, semver
from dradriver.logs import get_logger
from dradriver.nvml.explain import explain_init_failure

log = get_logger("nvml.discover")

# NVML_DEVICE_ARCH_* -> the spelling of NVIDIA's own software, so claims written for
# NVIDIA's DRA driver select the same devices here: go-nvlib's
# GetArchitectureAsString (NVIDIA/go-nvlib pkg/nvlib/device/device.go), which NVIDIA's
# k8s-dra-driver-gpu publishes as-is; nvidia-smi -q's product_architecture agrees
# ("Ada Lovelace" for L40S). Rubin (13) is not in go-nvlib yet: named as NVML names it.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
# NVML_BRAND_* -> go-nvlib's GetBrandAsString (same file). Values from nvidia-ml-py
# 13.x; 17 and up are not spelled by go-nvlib and fall back to "brand-<n>".
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
# Architectures that can switch MIG mode on demand, without a GPU reset.
MIG_SWITCHABLE_FROM = 9
MAX_PLACEMENTS = 8


@dataclass
class Discovery:
    inventory: Inventory
    # GPUs NVML could not describe (lost, in error); published GPUs never include them.
    problems: list[str] = field(default_factory=list)


@contextmanager
def nvml_session(nvml: ModuleType) -> Iterator[None]:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise explain_init_failure(nvml, err) from err
    try:
        yield
    finally:
        with suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def sysfs_pcie_root(bus_id: str) -> str | None:
    """The PCIe root complex of a device, e.g. "pci0000:00", from sysfs."""
    try:
        real = os.path.realpath(f"/sys/bus/pci/devices/{bus_id}")
    except OSError:
        return None
    parts = real.split("/")
    if len(parts) > 3 and parts[1:3] == ["sys", "devices"] and parts[3].startswith("pci"):
        return parts[3]
    return None


def normalize_bus_id(raw: str) -> str:
    """NVML's "00000000:18:00.0" -> sysfs' "0000:18:00.0"."""
    raw = raw.strip().lower()
    domain, _, rest = raw.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else raw


def _opt(nvml: ModuleType, fn: Callable[..., Any], *args: Any) -> Any:
    """Optional facts: NOT_SUPPORTED (and friends) mean "not available", not failure."""
    try:
        return fn(*args)
    except (
        nvml.NVMLError_NotSupported,
        nvml.NVMLError_FunctionNotFound,
        nvml.NVMLError_InvalidArgument,
    ):
        return None


def _profile_name(info: Any, index: int, nvml: ModuleType) -> str:
    name = str(getattr(info, "name", "") or "").removeprefix("MIG ").strip()
    if name:
        return name
    gb = round(info.memorySizeMB / 1024)
    suffix = "+me" if index == getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", -1) else ""
    return f"{info.sliceCount}g.{gb}gb{suffix}"


def _mig_profiles(nvml: ModuleType, h: Any) -> list[MigProfile]:
    out: list[MigProfile] = []
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = _opt(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, h, index)
        if info is None or info.instanceCount == 0:
            continue
        arr = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(count))
        placements = [arr[i] for i in range(count.value)]
        if not placements:
            continue
        out.append(
            MigProfile(
                profile_id=info.id,
                name=_profile_name(info, index, nvml),
                compute_slices=info.sliceCount,
                memory_slices=placements[0].size,
                memory_bytes=info.memorySizeMB * 1024 * 1024,
                multiprocessors=info.multiprocessorCount,
                copy_engines=info.copyEngineCount,
                decoders=info.decoderCount,
                encoders=info.encoderCount,
                jpeg_engines=info.jpegCount,
                ofa_engines=info.ofaCount,
                placements=tuple(p.start for p in placements),
                instance_count=info.instanceCount,
            )
        )
    return out


def _mig_devices(
    nvml: ModuleType, h: Any, parent_uuid: str, *, profiles: list[MigProfile]
) -> list[MigDevice]:
    by_id = {p.profile_id: p for p in profiles}
    out: list[MigDevice] = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except nvml.NVMLError_NotFound:
            continue
        gi_id = nvml.nvmlDeviceGetGpuInstanceId(mh)
        ci_id = nvml.nvmlDeviceGetComputeInstanceId(mh)
        gi_info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(h, gi_id))
        profile = by_id.get(gi_info.profileId)
        attrs = _opt(nvml, nvml.nvmlDeviceGetAttributes, mh)
        gi_slices = int(attrs.gpuInstanceSliceCount) if attrs is not None else 0
        out.append(
            MigDevice(
                uuid=str(nvml.nvmlDeviceGetUUID(mh)),
                parent_uuid=parent_uuid,
                profile=profile.name if profile else f"profile-{gi_info.profileId}",
                profile_id=gi_info.profileId,
                placement_start=gi_info.placement.start,
                placement_size=gi_info.placement.size,
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                memory_bytes=nvml.nvmlDeviceGetMemoryInfo(mh).total,
                multiprocessors=(
                    attrs.multiprocessorCount
                    if attrs is not None
                    else profile.multiprocessors
                    if profile
                    else 0
                ),
                compute_slices=int(attrs.computeInstanceSliceCount) if attrs is not None else 0,
                gpu_instance_slices=gi_slices or (profile.compute_slices if profile else 0),
            )
        )
    per_gi: dict[int, int] = {}
    for d in out:
        per_gi[d.gpu_instance_id] = per_gi.get(d.gpu_instance_id, 0) + 1
    out = [replace(d, siblings=per_gi[d.gpu_instance_id]) for d in out]
    return sorted(out, key=lambda d: (d.placement_start, d.profile_id, d.compute_instance_id))


def _idle_gpu_instances(
    nvml: ModuleType, h: Any, profiles: list[MigProfile], *, busy: set[int]
) -> list[IdleGpuInstance]:
    """GPU instances without a compute instance (no MIG device lists them)."""
    out: list[IdleGpuInstance] = []
    for p in profiles:
        arr = (nvml.c_nvmlGpuInstance_t * 8)()
        count = ctypes.c_uint(8)
        try:
            nvml.nvmlDeviceGetGpuInstances(h, p.profile_id, arr, ctypes.byref(count))
        except nvml.NVMLError:
            continue
        for i in range(count.value):
            info = nvml.nvmlGpuInstanceGetInfo(arr[i])
            if info.id in busy:
                continue
            out.append(
                IdleGpuInstance(
                    profile=p.name,
                    profile_id=p.profile_id,
                    placement_start=info.placement.start,
                    placement_size=info.placement.size,
                    gpu_instance_id=info.id,
                )
            )
    return sorted(out, key=lambda g: g.placement_start)


def _fabric_domain(nvml: ModuleType, h: Any) -> str | None:
    """Multi-node NVLink: GPUs of one clique share (clusterUuid, cliqueId)."""
    if not hasattr(nvml, "c_nvmlGpuFabricInfoV_t"):
        return None
    info = nvml.c_nvmlGpuFabricInfoV_t()
    if _opt(nvml, lambda: nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))) is None:
        return None
    if info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nvml.NVML_SUCCESS:
        return None
    raw = bytes(info.clusterUuid)
    if not any(raw):
        return None
    h32 = raw.hex()
    cluster = f"{h32[:8]}-{h32[8:12]}-{h32[12:16]}-{h32[16:20]}-{h32[20:32]}"
    return f"{cluster}.{info.cliqueId}"


def _nvlink_peers(nvml: ModuleType, h: Any) -> list[str] | None:
    """Remote PCI endpoints (peer GPUs or NVSwitches) of active links; None without NVLink."""
    peers: list[str] = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(h, link)
        except (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_InvalidArgument,
            nvml.NVMLError_FunctionNotFound,
        ):
            break
        if active:
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            peers.append(normalize_bus_id(str(remote.busId)))
    return peers if peers else None


def _local_domains(gpus: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """Connected components of the NVLink graph (GPUs and switches as nodes) -> a stable
    domain name per GPU UUID. `gpus`: bus id -> (uuid, remote endpoints)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for bus, (_, peers) in gpus.items():
        for p in peers:
            parent[find(bus)] = find(p)
    groups: dict[str, list[str]] = {}
    for bus, (uuid, _) in gpus.items():
        groups.setdefault(find(bus), []).append(uuid)
    out: dict[str, str] = {}
    for members in groups.values():
        digest = hashlib.sha256(",".join(sorted(members)).encode()).hexdigest()[:12]
        for uuid in members:
            out[uuid] = f"nvlink-{digest}"
    return out


def discover(
    nvml: ModuleType, pcie_root_of: Callable[[str], str | None] = sysfs_pcie_root
) -> Discovery:
    """Reads the node's GPUs. Call inside nvml_session()."""
    release = str(nvml.nvmlSystemGetDriverVersion()).strip()
    driver = semver(release)
    cuda = cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    gpus: list[Gpu] = []
    problems: list[str] = []
    links: dict[str, tuple[str, list[str]]] = {}
    fabric: dict[str, str] = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            gpu, peers, clique = _one_gpu(nvml, index, pcie_root_of)
        except nvml.NVMLError as err:
            problems.append(f"GPU index {index}: {type(err).__name__}: {err}")
            log.error("GPU left out of the inventory", index=index, error=str(err))
            continue
        gpus.append(gpu)
        if clique:
            fabric[gpu.uuid] = clique
        elif peers:
            links[gpu.pci_bus_id] = (gpu.uuid, peers)
    domains = {**_local_domains(links), **fabric}
    names = stable_names(g.uuid for g in gpus)
    gpus = [replace(_with_domain(g, domains.get(g.uuid)), name=names[g.uuid]) for g in gpus]
    return Discovery(
        Inventory(
            driver_version=driver,
            cuda_driver_version=cuda,
            gpus=tuple(gpus),
            driver_release=release,
        ),
        problems,
    )


def _with_domain(g: Gpu, domain: str | None) -> Gpu:
    return replace(g, nvlink_domain=domain) if domain else g


def _one_gpu(
    nvml: ModuleType, index: int, pcie_root_of: Callable[[str], str | None]
) -> tuple[Gpu, list[str] | None, str | None]:
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = str(nvml.nvmlDeviceGetUUID(h))
    bus_id = normalize_bus_id(str(nvml.nvmlDeviceGetPciInfo(h).busId))
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
    arch = int(nvml.nvmlDeviceGetArchitecture(h))
    mig_mode = _opt(nvml, nvml.nvmlDeviceGetMigMode, h)
    mig_capable = mig_mode is not None
    mig_enabled = bool(mig_mode and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE)
    profiles = _mig_profiles(nvml, h) if mig_capable else []
    attrs = _opt(nvml, nvml.nvmlDeviceGetAttributes, h)
    numa = _opt(nvml, nvml.nvmlDeviceGetNumaNodeId, h)
    gpu = Gpu(
        index=index,
        uuid=uuid,
        minor=int(nvml.nvmlDeviceGetMinorNumber(h)),
        product_name=str(nvml.nvmlDeviceGetName(h)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
        pci_bus_id=bus_id,
        cuda_compute_capability=compute_capability(major, minor),
        architecture=ARCHITECTURES.get(arch, f"arch-{arch}"),
        brand=_brand(nvml, int(nvml.nvmlDeviceGetBrand(h))),
        multiprocessors=attrs.multiprocessorCount
        if attrs is not None and not mig_enabled
        else None,
        pcie_root=pcie_root_of(bus_id),
        numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_switchable=mig_capable and arch >= MIG_SWITCHABLE_FROM,
        mig_profiles=tuple(profiles),
    )
    if mig_enabled:
        devices = _mig_devices(nvml, h, uuid, profiles=profiles)
        idle = _idle_gpu_instances(nvml, h, profiles, busy={d.gpu_instance_id for d in devices})
        gpu = replace(gpu, mig_devices=tuple(devices), idle_gpu_instances=tuple(idle))
    return gpu, _nvlink_peers(nvml, h), _fabric_domain(nvml, h)


def _brand(nvml: ModuleType, value: int) -> str:
    return BRANDS.get(value, f"brand-{value}")
