"""The one device model: every device this node can hand out, typed and named.

`offer(inventory, mode)` is a pure function. The slice builder renders its devices into
ResourceSlices (dradriver.slices.build) and prepare looks the allocated names up in it
(dradriver.kubeletplugin.prepare.plan), so publishing and preparing can never disagree about
what a device name means, and prepare never reads slice JSON back.

Three MIG modes:
- none: whole GPUs only (a GPU in MIG mode cannot be used whole, so it is left out);
- static: whole GPUs, and the existing MIG devices of GPUs in MIG mode instead of them;
- dynamic: every GPU whole and every MIG profile x placement as a partition carved at
  prepare; those devices share the GPU's counter set (`GpuOffer.counters`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from dradriver.inventory import mig_geometry
from dradriver.inventory.model import Gpu, Inventory, MigDevice, MigProfile
from dradriver.inventory.naming import default_name


class MigMode(enum.StrEnum):
    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"


class MigSwitching(enum.StrEnum):
    """Whether the driver may switch a GPU's MIG mode (dynamic mode only): on demand
    (on for a partition, off for a whole GPU, each switched back after), or never (where
    the admin sets MIG mode, e.g. because DCGM holds the GPUs)."""

    ON_DEMAND = "on-demand"
    NEVER = "never"


class DeviceKind(enum.StrEnum):
    GPU = "gpu"
    MIG = "mig"


@dataclass(frozen=True)
class Partition:
    """A MIG profile at one placement: a MIG device that does not exist until prepared."""

    profile: MigProfile
    start: int

    @property
    def memory_slices(self) -> frozenset[int]:
        return frozenset(self.profile.memory_range(self.start))


def profile_token(profile: str) -> str:
    """A device-name-safe form of a profile name that keeps distinct profiles distinct:
    "1g.10gb" -> "1g10gb", "1g.10gb+me" -> "1g10gbme", "1g.24gb-me" -> "1g24gbnome",
    "1g.24gb+me.all" -> "1g24gbmeall", "1g.24gb+gfx" -> "1g24gbgfx". ("+" adds what
    follows, "-" takes it away: without "no", "+me" and "-me" would both read "me".)"""
    return re.sub(r"[^a-z0-9]", "", profile.lower().replace("-", "no"))


def gpu_device_name(gpu: Gpu) -> str:
    """The GPU's name, from its UUID (inventory.naming says why not its NVML index)."""
    return gpu.name or default_name(gpu.uuid)


def mig_device_name(gpu: Gpu, profile: str, start: int) -> str:
    return f"{gpu_device_name(gpu)}-mig-{profile_token(profile)}-{start}"


def gpu_name_of(device: str) -> str:
    """The whole-GPU part of a device name: "gpu-9b3c2810-mig-3g40gb-4" -> "gpu-9b3c2810"."""
    return device.split("-mig-", 1)[0]


def compute_instance_name(gpu: Gpu, dev: MigDevice) -> str:
    """A MIG device that is one of several compute instances of its GPU instance (or a
    compute instance smaller than it) is named after both: gpu-9b3c2810-mig-3g40gb-4-ci1."""
    base = mig_device_name(gpu, dev.profile, dev.placement_start)
    if dev.siblings > 1 or dev.partial:
        return f"{base}-ci{dev.compute_instance_id}"
    return base


@dataclass(frozen=True)
class NodeDevice:
    """One device of the node's pool: a whole GPU, an existing MIG device, or a MIG
    partition carved at prepare."""

    name: str
    gpu: Gpu
    kind: DeviceKind
    mig: MigDevice | None = None  # an existing MIG device
    partition: Partition | None = None  # carved at prepare (dynamic mode)

    @property
    def uuid(self) -> str | None:
        """GPU-... or MIG-...; None for a partition, whose UUID exists only once carved."""
        if self.kind is DeviceKind.GPU:
            return self.gpu.uuid
        return self.mig.uuid if self.mig is not None else None

    @property
    def profile(self) -> MigProfile | None:
        if self.partition is not None:
            return self.partition.profile
        if self.mig is not None:
            return self.gpu.profile(self.mig.profile)
        return None

    @property
    def profile_name(self) -> str | None:
        """The profile as nvidia-smi names the device ("1c.3g.40gb" for a compute
        instance smaller than its GPU instance)."""
        if self.partition is not None:
            return self.partition.profile.name
        return self.mig.device_profile if self.mig is not None else None

    @property
    def placement_start(self) -> int | None:
        if self.partition is not None:
            return self.partition.start
        return self.mig.placement_start if self.mig is not None else None

    @property
    def memory_slices(self) -> frozenset[int]:
        """The GPU memory slices this device occupies (all of them for a whole GPU)."""
        if self.partition is not None:
            return self.partition.memory_slices
        if self.mig is not None:
            start, size = self.mig.placement_start, self.mig.placement_size
            return frozenset(range(start, start + size))
        return frozenset(range(mig_geometry.geometry(self.gpu.mig_profiles).grid))

    def overlaps(self, other: NodeDevice) -> bool:
        """Two devices cannot be prepared for two claims at once if they share hardware.
        Compute instances of one GPU instance share its memory by design, not their
        compute: each can serve another claim."""
        if self.name == other.name:
            return True
        if self.gpu.uuid != other.gpu.uuid:
            return False
        a, b = self.mig, other.mig
        if a is not None and b is not None and a.gpu_instance_id == b.gpu_instance_id:
            return a.compute_instance_id == b.compute_instance_id
        return bool(self.memory_slices & other.memory_slices)


def whole_gpu(gpu: Gpu) -> NodeDevice:
    return NodeDevice(gpu_device_name(gpu), gpu, DeviceKind.GPU)


def existing_mig(gpu: Gpu, dev: MigDevice) -> NodeDevice:
    return NodeDevice(compute_instance_name(gpu, dev), gpu, DeviceKind.MIG, mig=dev)


def partition(gpu: Gpu, part: Partition) -> NodeDevice:
    return NodeDevice(
        mig_device_name(gpu, part.profile.name, part.start), gpu, DeviceKind.MIG, partition=part
    )


def partitions(profiles: Iterable[MigProfile]) -> list[Partition]:
    return [Partition(p, s) for p in profiles for s in p.placements]


def packing_order(profiles: Iterable[MigProfile]) -> list[Partition]:
    """The partitions in the order the scheduler should try them. It takes the first
    device that fits (within a pool, in slice order), so this order is the packing
    policy. A profile that can end on the GPU's last memory slice (3g at 4, the
    double-memory 1g at 6) takes its placements from the high end: that slice is of no
    use to the smaller profiles (1g and 2g cannot reach it), and the low end stays free
    for 4g and 7g, which can only start at 0. Every other profile fills from the low end.
    On random streams of 1g/1g-double/2g/3g/4g/7g claims over two H100s this places 2%
    more claims than placements in ascending order (tests/unit/slices/test_packing.py)."""
    ps = list(profiles)
    grid = mig_geometry.geometry(ps).grid
    out: list[Partition] = []
    for p in ps:
        whole = p.memory_slices >= grid
        reaches_end = any(s + p.memory_slices == grid for s in p.placements)
        out += [Partition(p, s) for s in sorted(p.placements, reverse=reaches_end and not whole)]
    return out


@dataclass(frozen=True)
class GpuOffer:
    """The devices of one GPU. With `counters` they are published in the GPU's own slice
    with its counter set (dynamic mode), otherwise packed with other GPUs' devices."""

    gpu: Gpu
    devices: tuple[NodeDevice, ...]
    counters: bool = False
    # GPU instances this driver did not make (MIG devices of them, or none: a GPU instance
    # without a compute instance): they take their share of the GPU for good, so the
    # counter set is published with that share already used.
    occupied: tuple[Partition, ...] = ()
    # Partitions carved for a claim whose record was lost: never published, but known to
    # prepare, so that the kubelet preparing that same claim again gets its device back.
    unpublished: tuple[NodeDevice, ...] = ()


@dataclass(frozen=True)
class Skipped:
    """A GPU left out, or offered in part, and why: the CLI, the logs and a metric tell a
    user why a device is missing instead of publishing it wrong."""

    uuid: str
    reason: str  # short, for the metric: mig_enabled, no_mig_devices, not_switchable, ...
    message: str


@dataclass(frozen=True)
class NodeOffer:
    gpus: tuple[GpuOffer, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    def devices(self) -> dict[str, NodeDevice]:
        """Every device prepare may be asked for: the published ones, and partitions held
        for claims whose record was lost (prepare gives those to their own claim only)."""
        return {d.name: d for g in self.gpus for d in (*g.devices, *g.unpublished)}


def offer(
    inv: Inventory,
    mode: MigMode,
    owned_mig: Iterable[tuple[str, int, int]] = (),
    *,
    switching: MigSwitching = MigSwitching.ON_DEMAND,
    held_mig: Iterable[tuple[str, int, int]] = (),
    profiles: frozenset[str] = frozenset(),
) -> NodeOffer:
    """What the node offers. `owned_mig`: (parent UUID, profile ID, placement start) of
    MIG devices this driver created for prepared claims; in dynamic mode they stay
    offered as the partitions they were carved from. `held_mig`: MIG devices this driver
    created for claims whose record is lost; not offered at all until released.
    `profiles`: dynamic mode offers partitions of these profiles only (empty: all)."""
    owned = frozenset(owned_mig)
    held = frozenset(held_mig)
    skipped: list[Skipped] = []
    gpus: list[GpuOffer] = []
    for gpu in sorted(inv.gpus, key=lambda g: g.index):
        if mode is MigMode.NONE:
            if gpu.mig_enabled:
                skipped.append(
                    Skipped(
                        gpu.uuid,
                        "mig_enabled",
                        "MIG mode is enabled, so the GPU cannot be used whole; "
                        "use --mig-mode static or dynamic, or disable MIG",
                    )
                )
                continue
            gpus.append(GpuOffer(gpu, (whole_gpu(gpu),)))
        elif mode is MigMode.STATIC:
            if gpu.mig_enabled:
                if not gpu.mig_devices:
                    skipped.append(
                        Skipped(
                            gpu.uuid,
                            "no_mig_devices",
                            "MIG mode is enabled but no MIG device exists",
                        )
                    )
                gpus.append(GpuOffer(gpu, tuple(existing_mig(gpu, d) for d in gpu.mig_devices)))
            else:
                gpus.append(GpuOffer(gpu, (whole_gpu(gpu),)))
        else:
            gpus.append(
                _dynamic(gpu, owned, skipped, switching=switching, held=held, profiles=profiles)
            )
    return NodeOffer(tuple(gpus), tuple(skipped))


def _dynamic(
    gpu: Gpu,
    owned: frozenset[tuple[str, int, int]],
    skipped: list[Skipped],
    *,
    switching: MigSwitching,
    held: frozenset[tuple[str, int, int]] = frozenset(),
    profiles: frozenset[str] = frozenset(),
) -> GpuOffer:
    # Whether this driver may switch the GPU's MIG mode when a claim needs it switched.
    may_switch = gpu.mig_switchable and switching is MigSwitching.ON_DEMAND
    can_carve = gpu.mig_capable and gpu.mig_profiles and (gpu.mig_enabled or may_switch)
    if not can_carve:
        if gpu.mig_capable and not gpu.mig_enabled and gpu.mig_switchable:
            skipped.append(
                Skipped(
                    gpu.uuid,
                    "no_switching",
                    "MIG partitions not offered: MIG mode is off and "
                    "--mig-mode-switching=never; enable MIG mode to carve it",
                )
            )
        elif gpu.mig_capable and not gpu.mig_enabled and not gpu.mig_switchable:
            skipped.append(
                Skipped(
                    gpu.uuid,
                    "not_switchable",
                    "MIG partitions not offered: this GPU cannot switch MIG "
                    "mode on demand; enable MIG mode (and reset) to carve it",
                )
            )
        if gpu.mig_enabled:
            return GpuOffer(gpu, tuple(existing_mig(gpu, d) for d in gpu.mig_devices))
        return GpuOffer(gpu, (whole_gpu(gpu),))
    # MIG devices this driver did not create take their share of the GPU for good: offer
    # them as they are, and no partition that cannot be carved beside them (overlapping
    # memory, or engines or compute they already hold).
    foreign = [
        d for d in gpu.mig_devices if (gpu.uuid, d.profile_id, d.placement_start) not in owned
    ]
    occupied = _occupied(gpu, foreign)
    caps = mig_geometry.geometry(gpu.mig_profiles).capacities(gpu.mig_profiles)
    taken = [mig_geometry.demand(p.profile, p.start) for p in occupied]
    devices: list[NodeDevice] = []
    # Whole only where it can be given whole: MIG off, or switched off for the claim.
    if not occupied and (may_switch or not gpu.mig_enabled):
        devices.append(whole_gpu(gpu))
    # Only the chosen profiles (fewer devices for the API server and the scheduler to
    # hold), but always the partitions prepared claims hold: prepare finds them by name.
    devices += [
        partition(gpu, p)
        for p in packing_order(gpu.mig_profiles)
        if (
            not profiles
            or p.profile.name in profiles
            or (gpu.uuid, p.profile.profile_id, p.start) in owned
        )
        and mig_geometry.fits(taken, mig_geometry.demand(p.profile, p.start), caps)
    ]
    devices += [
        existing_mig(gpu, d)
        for d in foreign
        if (gpu.uuid, d.profile_id, d.placement_start) not in held
    ]
    by_id = {p.profile_id: p for p in gpu.mig_profiles}
    unpublished = tuple(
        partition(gpu, Partition(by_id[d.profile_id], d.placement_start))
        for d in foreign
        if (gpu.uuid, d.profile_id, d.placement_start) in held and d.profile_id in by_id
    )
    return GpuOffer(gpu, tuple(devices), counters=True, occupied=occupied, unpublished=unpublished)


def _occupied(gpu: Gpu, foreign: Iterable[MigDevice]) -> tuple[Partition, ...]:
    """The GPU instances of `foreign` MIG devices (once each, however many compute
    instances they hold) and the GPU's idle GPU instances, as profile x placement."""
    seen: dict[int, Partition] = {}
    by_id = {p.profile_id: p for p in gpu.mig_profiles}
    held = [(d.gpu_instance_id, d.profile_id, d.placement_start, d.placement_size) for d in foreign]
    held += [
        (g.gpu_instance_id, g.profile_id, g.placement_start, g.placement_size)
        for g in gpu.idle_gpu_instances
    ]
    for gi, profile_id, start, size in held:
        profile = by_id.get(profile_id) or _unknown_profile(profile_id, size)
        seen.setdefault(gi, Partition(profile, start))
    return tuple(seen.values())


def _unknown_profile(profile_id: int, size: int) -> MigProfile:
    """A GPU instance of a profile NVML did not list: all we know is where it sits."""
    return MigProfile(
        profile_id=profile_id,
        name=f"profile-{profile_id}",
        compute_slices=0,
        memory_slices=size,
        memory_bytes=0,
        multiprocessors=0,
        copy_engines=0,
        decoders=0,
        encoders=0,
        jpeg_engines=0,
        ofa_engines=0,
        placements=(),
        instance_count=0,
    )
