"""The pure function at the heart of publishing: inventory -> desired ResourceSlices.

One pool per node, named after the node. Three MIG modes:
- none: whole GPUs only (a GPU in MIG mode cannot be used whole, so it is left out);
- static: whole GPUs, and the existing MIG devices of GPUs in MIG mode instead of them;
- dynamic: every GPU whole and every MIG profile x placement as a partition, all consuming
  the GPU's counter set (see counters.py); one slice per such GPU, because in 1.34 a
  device can only consume counter sets declared in its own slice.
Devices without counters are packed into as few slices as the 128-device limit allows.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dradriver.inventory.model import Gpu, Inventory, MigDevice, MigProfile
from dradriver.slices import counters as ctr

STANDARD_DOMAIN = "resource.kubernetes.io"
MAX_DEVICES = 128
MAX_SHARED_COUNTERS = 32
MAX_DEVICE_COUNTERS = 1024
MAX_COUNTERS_PER_DEVICE = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALUE_LENGTH = 64
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ATTRIBUTE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


class MigMode(enum.StrEnum):
    NONE = "none"
    STATIC = "static"
    DYNAMIC = "dynamic"


@dataclass(frozen=True)
class SliceContent:
    """One ResourceSlice's spec without pool bookkeeping (the publisher adds that)."""

    key: str  # stable identity across restarts: "gpu-3" or "devices-0"
    devices: tuple[dict[str, Any], ...]
    shared_counters: tuple[dict[str, Any], ...] = ()

    def fingerprint(self) -> str:
        body = json.dumps([self.devices, self.shared_counters], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:32]


@dataclass
class BuildResult:
    slices: list[SliceContent]
    # GPUs left out, with the reason, so the CLI and logs can tell a user why a GPU
    # is missing instead of publishing it wrong.
    skipped: list[tuple[str, str]] = field(default_factory=list)


def profile_token(profile: str) -> str:
    """ "1g.10gb+me" -> "1g10gbme": a device-name-safe form of a profile name."""
    return re.sub(r"[^a-z0-9]", "", profile.lower())


def gpu_device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}"


def mig_device_name(gpu: Gpu, profile: str, start: int) -> str:
    return f"gpu-{gpu.index}-mig-{profile_token(profile)}-{start}"


def _s(v: str) -> dict[str, Any]:
    return {"string": v}


def _common(inv: Inventory, gpu: Gpu) -> dict[str, dict[str, Any]]:
    """Attributes a MIG device inherits from its parent GPU."""
    a: dict[str, dict[str, Any]] = {
        "productName": _s(gpu.product_name),
        "brand": _s(gpu.brand),
        "architecture": _s(gpu.architecture),
        "cudaComputeCapability": {"version": gpu.cuda_compute_capability},
        "driverVersion": {"version": inv.driver_version},
        "cudaDriverVersion": {"version": inv.cuda_driver_version},
        f"{STANDARD_DOMAIN}/pciBusID": _s(gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        a[f"{STANDARD_DOMAIN}/pcieRoot"] = _s(gpu.pcie_root)
    if gpu.numa_node is not None:
        a["numaNode"] = {"int": gpu.numa_node}
    if gpu.nvlink_domain:
        a["nvlinkDomain"] = _s(gpu.nvlink_domain)
    return a


def gpu_device(inv: Inventory, gpu: Gpu) -> dict[str, Any]:
    attrs = {
        "type": _s("gpu"),
        "uuid": _s(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "migCapable": {"bool": gpu.mig_capable},
        **_common(inv, gpu),
    }
    capacity = {"memory": {"value": str(gpu.memory_bytes)}}
    if gpu.multiprocessors is not None:
        capacity["multiprocessors"] = {"value": str(gpu.multiprocessors)}
    return {"name": gpu_device_name(gpu), "attributes": attrs, "capacity": capacity}


def _mig_capacity(memory_bytes: int, profile: MigProfile | None, sms: int) -> dict[str, Any]:
    cap: dict[str, Any] = {
        "memory": {"value": str(memory_bytes)},
        "multiprocessors": {"value": str(sms)},
    }
    if profile is not None:
        cap.update(
            {
                "copyEngines": {"value": str(profile.copy_engines)},
                "decoders": {"value": str(profile.decoders)},
                "encoders": {"value": str(profile.encoders)},
                "jpegEngines": {"value": str(profile.jpeg_engines)},
                "ofaEngines": {"value": str(profile.ofa_engines)},
            }
        )
    return cap


def mig_device(inv: Inventory, gpu: Gpu, dev: MigDevice) -> dict[str, Any]:
    """An existing MIG device (static mode, or foreign in dynamic mode)."""
    attrs = {
        "type": _s("mig"),
        "uuid": _s(dev.uuid),
        "parentUUID": _s(gpu.uuid),
        "parentIndex": {"int": gpu.index},
        "profile": _s(dev.profile),
        "placementStart": {"int": dev.placement_start},
        **_common(inv, gpu),
    }
    return {
        "name": mig_device_name(gpu, dev.profile, dev.placement_start),
        "attributes": attrs,
        "capacity": _mig_capacity(dev.memory_bytes, gpu.profile(dev.profile), dev.multiprocessors),
    }


def partition_device(inv: Inventory, gpu: Gpu, part: ctr.Partition) -> dict[str, Any]:
    """A MIG device that does not exist yet: carved at prepare if allocated."""
    p = part.profile
    attrs = {
        "type": _s("mig"),
        "parentUUID": _s(gpu.uuid),
        "parentIndex": {"int": gpu.index},
        "profile": _s(p.name),
        "placementStart": {"int": part.start},
        **_common(inv, gpu),
    }
    return {
        "name": mig_device_name(gpu, p.name, part.start),
        "attributes": attrs,
        "capacity": _mig_capacity(p.memory_bytes, p, p.multiprocessors),
    }


def _consumes(counter_set: str, counters: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {"counterSet": counter_set, "counters": {c: {"value": str(v)} for c, v in counters.items()}}
    ]


def _dynamic_gpu(
    inv: Inventory, gpu: Gpu, owned: frozenset[tuple[str, int, int]], skipped: list[tuple[str, str]]
) -> tuple[list[dict[str, Any]], SliceContent | None]:
    """Devices of one GPU in dynamic mode: (devices without counters, or its own slice)."""
    can_carve = gpu.mig_capable and gpu.mig_profiles and (gpu.mig_enabled or gpu.mig_switchable)
    if not can_carve:
        if gpu.mig_capable and not gpu.mig_enabled and not gpu.mig_switchable:
            skipped.append(
                (
                    gpu.uuid,
                    "MIG partitions not offered: this GPU cannot switch MIG "
                    "mode on demand; enable MIG mode (and reset) to carve it",
                )
            )
        if gpu.mig_enabled:
            return [mig_device(inv, gpu, d) for d in gpu.mig_devices], None
        return [gpu_device(inv, gpu)], None
    design = ctr.design(tuple(gpu.mig_profiles))
    counter_set = gpu_device_name(gpu)
    # MIG devices this driver did not create occupy their memory slices for good: offer
    # them as they are, and no partition that overlaps them.
    foreign = [
        d for d in gpu.mig_devices if (gpu.uuid, d.profile_id, d.placement_start) not in owned
    ]
    busy = {
        i for d in foreign for i in range(d.placement_start, d.placement_start + d.placement_size)
    }
    devices: list[dict[str, Any]] = []
    if not foreign and (gpu.mig_switchable or not gpu.mig_enabled):
        whole = gpu_device(inv, gpu)
        whole["consumesCounters"] = _consumes(counter_set, design.whole_gpu())
        devices.append(whole)
    for part, consumption in design.consumption.items():
        if busy & set(part.profile.memory_range(part.start)):
            continue
        dev = partition_device(inv, gpu, part)
        dev["consumesCounters"] = _consumes(counter_set, consumption)
        devices.append(dev)
    for d in foreign:
        dev = mig_device(inv, gpu, d)
        profile = gpu.profile(d.profile)
        taken = ctr.Partition(profile, d.placement_start) if profile else None
        if taken is not None and taken in design.consumption:
            dev["consumesCounters"] = _consumes(counter_set, design.consumption[taken])
        devices.append(dev)
    shared = (
        {
            "name": counter_set,
            "counters": {c: {"value": str(v)} for c, v in design.capacities.items()},
        },
    )
    return [], SliceContent(key=f"gpu-{gpu.index}", devices=tuple(devices), shared_counters=shared)


def _pack(devices: Sequence[dict[str, Any]]) -> list[SliceContent]:
    return [
        SliceContent(key=f"devices-{i // MAX_DEVICES}", devices=tuple(devices[i : i + MAX_DEVICES]))
        for i in range(0, len(devices), MAX_DEVICES)
    ]


def build(
    inv: Inventory, mode: MigMode, owned_mig: Iterable[tuple[str, int, int]] = ()
) -> BuildResult:
    """`owned_mig`: (parent UUID, profile ID, placement start) of MIG devices this driver
    created for prepared claims; they stay published as partitions in dynamic mode."""
    owned = frozenset(owned_mig)
    skipped: list[tuple[str, str]] = []
    loose: list[dict[str, Any]] = []
    own_slices: list[SliceContent] = []
    for gpu in sorted(inv.gpus, key=lambda g: g.index):
        if mode is MigMode.NONE:
            if gpu.mig_enabled:
                skipped.append(
                    (
                        gpu.uuid,
                        "MIG mode is enabled, so the GPU cannot be used whole; "
                        "use --mig-mode static or dynamic, or disable MIG",
                    )
                )
                continue
            loose.append(gpu_device(inv, gpu))
        elif mode is MigMode.STATIC:
            if gpu.mig_enabled:
                if not gpu.mig_devices:
                    skipped.append((gpu.uuid, "MIG mode is enabled but no MIG device exists"))
                loose += [mig_device(inv, gpu, d) for d in gpu.mig_devices]
            else:
                loose.append(gpu_device(inv, gpu))
        else:
            devs, own = _dynamic_gpu(inv, gpu, owned, skipped)
            loose += devs
            if own:
                own_slices.append(own)
    result = BuildResult(slices=own_slices + _pack(loose), skipped=skipped)
    check_limits(result.slices)
    return result


class LimitError(ValueError):
    pass


def check_limits(slices: Sequence[SliceContent]) -> None:
    """The 1.34 ResourceSlice validation rules we can break; a bug here must fail loudly in
    our tests, not as a 422 from the API server on a customer's node."""
    names: set[str] = set()
    for s in slices:
        where = f"slice {s.key}"
        if len(s.devices) > MAX_DEVICES:
            raise LimitError(f"{where}: {len(s.devices)} devices > {MAX_DEVICES}")
        shared = sum(len(cs["counters"]) for cs in s.shared_counters)
        if shared > MAX_SHARED_COUNTERS:
            raise LimitError(f"{where}: {shared} shared counters > {MAX_SHARED_COUNTERS}")
        per_slice = 0
        for d in s.devices:
            name = d["name"]
            if not DNS_LABEL.match(name):
                raise LimitError(f"{where}: device name {name!r} is not a DNS label")
            if name in names:
                raise LimitError(f"{where}: device name {name!r} used twice in the pool")
            names.add(name)
            n = len(d.get("attributes", {})) + len(d.get("capacity", {}))
            if n > MAX_ATTRIBUTES_AND_CAPACITIES:
                raise LimitError(f"{where}: device {name}: {n} attributes+capacities > 32")
            for key, val in d.get("attributes", {}).items():
                ident = key.rsplit("/", 1)[-1]
                if not ATTRIBUTE_ID.match(ident):
                    raise LimitError(f"{where}: device {name}: bad attribute name {key!r}")
                for kind in ("string", "version"):
                    if kind in val and len(val[kind]) > MAX_VALUE_LENGTH:
                        raise LimitError(f"{where}: device {name}: {key} longer than 64")
            consumed = sum(len(c["counters"]) for c in d.get("consumesCounters", []))
            if consumed > MAX_COUNTERS_PER_DEVICE:
                raise LimitError(f"{where}: device {name}: consumes {consumed} counters > 32")
            per_slice += consumed
        if per_slice > MAX_DEVICE_COUNTERS:
            raise LimitError(f"{where}: devices consume {per_slice} counters > 1024")
