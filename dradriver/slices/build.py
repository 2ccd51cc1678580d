"""The pure function at the heart of publishing: the node's offer -> ResourceSlices.

One pool per node, named after the node. Which devices exist in each MIG mode is decided
by dradriver.inventory.node_devices (the device model prepare uses too); this module
renders them (attributes and capacities per device, see attributes.py; each GPU's counter
set in dynamic mode, see counters.py) and lays them out in slices as the API server's
Kubernetes line requires (dradriver.k8s.lines):

- 1.34: a device may consume only counter sets of its own slice, so each GPU's counter
  set goes in the slice of its devices, and GPUs with counters share slices as far as the
  limits allow (`_merge`); devices without counters fill slices of up to 128.
- 1.35 and later refuse a slice with both devices and counter sets: the counter sets go in
  slices of their own (8 a slice), the devices in slices of up to 64 (the limit where a
  device consumes counters or has taints), in the order the allocator should try them
  (`_apart`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dradriver.inventory.model import Inventory
from dradriver.inventory.node_devices import (
    DeviceKind,
    GpuOffer,
    MigMode,
    MigSwitching,
    NodeOffer,
    Skipped,
    gpu_device_name,
    offer,
)
from dradriver.k8s.lines import OLDEST, Line
from dradriver.slices import counters as ctr
from dradriver.slices.attributes import render
from dradriver.slices.consumable import OFF, Consumable

__all__ = ["BuildResult", "MigMode", "SliceContent", "build"]

MAX_DEVICES = 128
# 1.34's counter limits (k8s.io/api v0.34.4 resource/v1/types.go).
MAX_SHARED_COUNTERS = 32
MAX_DEVICE_COUNTERS = 1024
MAX_COUNTERS_PER_DEVICE = 32
# From 1.35 (v0.35.4): counters a set, counter sets a device consumes.
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALUE_LENGTH = 64
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
ATTRIBUTE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


@dataclass(frozen=True)
class SliceContent:
    """One ResourceSlice's spec without pool bookkeeping (the publisher adds that)."""

    key: str  # stable identity across restarts: "gpus-9b3c2810", "devices-00", "counters-0"
    devices: tuple[dict[str, Any], ...]
    shared_counters: tuple[dict[str, Any], ...] = ()

    def fingerprint(self) -> str:
        body = json.dumps([self.devices, self.shared_counters], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:32]


@dataclass
class BuildResult:
    slices: list[SliceContent]
    # GPUs left out or offered in part, with the reason.
    skipped: list[Skipped] = field(default_factory=list)
    # The typed devices the slices render, by name: what prepare looks names up in.
    offer: NodeOffer = field(default_factory=NodeOffer)


def _consumes(counter_set: str, counters: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {"counterSet": counter_set, "counters": {c: {"value": str(v)} for c, v in counters.items()}}
    ]


def _counted(inv: Inventory, g: GpuOffer) -> SliceContent:
    """A GPU's devices with its counter set, and what each device consumes of it. GPU
    instances someone else made are not allocatable through the counters, so the
    counter set is published with their share already taken."""
    design = ctr.design(tuple(g.gpu.mig_profiles))
    counter_set = gpu_device_name(g.gpu)
    capacities = dict(design.capacities)
    for held in g.occupied:
        for c, v in ctr.demand(held).items():
            if c in capacities:
                capacities[c] = max(0, capacities[c] - v)
    devices: list[dict[str, Any]] = []
    for d in g.devices:
        out = render(inv, d)
        if d.kind is DeviceKind.GPU:
            out["consumesCounters"] = _consumes(counter_set, design.whole_gpu())
        elif d.partition is not None:
            out["consumesCounters"] = _consumes(counter_set, design.consumption[d.partition])
        # A MIG device someone else made consumes nothing: its share is already
        # subtracted from the counter set.
        devices.append(out)
    shared = (
        {
            "name": counter_set,
            "counters": {c: {"value": str(v)} for c, v in capacities.items()},
        },
    )
    return SliceContent(key=gpu_device_name(g.gpu), devices=tuple(devices), shared_counters=shared)


def _fits_with(group: Sequence[SliceContent], more: SliceContent) -> bool:
    every = [*group, more]
    return (
        sum(len(c.devices) for c in every) <= MAX_DEVICES
        and sum(len(cs["counters"]) for c in every for cs in c.shared_counters)
        <= MAX_SHARED_COUNTERS
        and sum(
            len(x["counters"])
            for c in every
            for d in c.devices
            for x in d.get("consumesCounters", ())
        )
        <= MAX_DEVICE_COUNTERS
    )


def _is_gpu(device: dict[str, Any]) -> bool:
    return bool(device["attributes"]["type"]["string"] == "gpu")


def _merge(group: Sequence[SliceContent]) -> SliceContent:
    """GPUs with counters share slices, as many as the 1.34 limits allow (32 shared
    counters: four A100s or H100s, each with 8). The scheduler pays per slice of the
    whole cluster for every node it filters (v0.34.4 structured/internal/experimental,
    GatherPools walks every slice to find the node's), so fewer slices cost it less.

    The order in the slice is the packing policy, since the scheduler takes the first
    device that fits: the whole GPUs first, from the lowest index up (a whole-GPU claim
    then never walks partitions, each a CEL evaluation, while a GPU of the slice is
    free), then the partitions GPU by GPU from the highest index down, so that
    partitions fill one GPU before they break into the next and whole-GPU and MIG
    claims start at opposite ends."""
    whole = [d for c in group for d in c.devices if _is_gpu(d)]
    parts = [d for c in reversed(group) for d in c.devices if not _is_gpu(d)]
    return SliceContent(
        key="gpus-" + group[0].key.removeprefix("gpu-"),  # "gpus-9b3c2810": that GPU and the next
        devices=(*whole, *parts),
        shared_counters=tuple(cs for c in group for cs in c.shared_counters),
    )


def _group(counted: Sequence[SliceContent]) -> list[SliceContent]:
    groups: list[list[SliceContent]] = []
    for c in counted:
        if groups and _fits_with(groups[-1], c):
            groups[-1].append(c)
        else:
            groups.append([c])
    return [_merge(g) for g in groups]


def _pack(devices: Sequence[dict[str, Any]]) -> list[SliceContent]:
    return [
        SliceContent(key=f"devices-{i // MAX_DEVICES}", devices=tuple(devices[i : i + MAX_DEVICES]))
        for i in range(0, len(devices), MAX_DEVICES)
    ]


def _apart(
    counted: Sequence[SliceContent], loose: Sequence[dict[str, Any]], line: Line
) -> list[SliceContent]:
    """The layout from 1.35 on: counter sets in slices of their own, then the devices in
    the order the allocator should try them, as 1.34's `_merge` orders one slice: whole
    GPUs from the lowest index up, then each GPU's partitions, GPU by GPU from the
    highest index down, then the devices without counters. A GPU's partitions stay in
    one slice where they fit, since 1.35 tries slices in no set order; from 1.36 slices
    are tried in name order, hence the zero-padded keys (the publisher keeps the key
    last in the slice's name)."""
    sets = [cs for c in counted for cs in c.shared_counters]
    per = line.max_counter_sets or len(sets) or 1
    out = [
        SliceContent(
            key=f"counters-{i // per}", devices=(), shared_counters=tuple(sets[i : i + per])
        )
        for i in range(0, len(sets), per)
    ]
    units: list[tuple[dict[str, Any], ...]] = [
        (d,) for c in counted for d in c.devices if _is_gpu(d)
    ]
    units += [tuple(d for d in c.devices if not _is_gpu(d)) for c in reversed(counted)]
    units += [(d,) for d in loose]
    # Every slice of this layout may be tainted later (a sick GPU), so every one keeps to
    # the limit for taints and counters.
    limit = line.max_devices_counted_or_tainted
    chunks: list[list[dict[str, Any]]] = [[]]
    for unit in units:
        if chunks[-1] and len(chunks[-1]) + len(unit) > limit:
            chunks.append([])
        for d in unit:
            if len(chunks[-1]) == limit:
                chunks.append([])
            chunks[-1].append(d)
    out += [
        SliceContent(key=f"devices-{i:02d}", devices=tuple(chunk))
        for i, chunk in enumerate(c for c in chunks if c)
    ]
    return out


def build(
    inv: Inventory,
    mode: MigMode,
    owned_mig: Iterable[tuple[str, int, int]] = (),
    *,
    switching: MigSwitching = MigSwitching.ON_DEMAND,
    held_mig: Iterable[tuple[str, int, int]] = (),
    profiles: frozenset[str] = frozenset(),
    consumable: Consumable = OFF,
    line: Line = OLDEST,
) -> BuildResult:
    """The node's slices, laid out for the API server's Kubernetes `line`. `owned_mig`:
    (parent UUID, profile ID, placement start) of MIG devices this driver created for
    prepared claims; they stay published as partitions in dynamic mode. A GPU whose
    devices would break a ResourceSlice rule is left out (with the reason in `skipped`):
    one odd GPU never stops the others being published."""
    node = offer(inv, mode, owned_mig, switching=switching, held_mig=held_mig, profiles=profiles)
    skipped = list(node.skipped)
    kept: list[GpuOffer] = []
    own: list[SliceContent] = []
    loose: list[dict[str, Any]] = []
    for g in node.gpus:
        try:
            if g.counters:
                content = _counted(inv, g)
                check_limits([content])
            else:
                content = SliceContent(
                    key=gpu_device_name(g.gpu),
                    devices=tuple(render(inv, d, consumable) for d in g.devices),
                )
                check_limits([content])
        except (LimitError, KeyError, ValueError) as exc:
            skipped.append(
                Skipped(
                    g.gpu.uuid,
                    "invalid_devices",
                    f"left out: its devices cannot be published: {exc}",
                )
            )
            continue
        kept.append(g)
        if g.counters:
            own.append(content)
        else:
            loose += content.devices
    result = BuildResult(
        slices=_apart(own, loose, line) if line.counters_apart else _group(own) + _pack(loose),
        skipped=skipped,
        offer=NodeOffer(tuple(kept), tuple(skipped)),
    )
    check_limits(result.slices, line)
    return result


class LimitError(ValueError):
    pass


def check_limits(slices: Sequence[SliceContent], line: Line = OLDEST) -> None:
    """The ResourceSlice validation rules of `line` we can break; a bug here must fail
    loudly in our tests, not as a 422 from the API server on a customer's node."""
    names: set[str] = set()
    for s in slices:
        where = f"slice {s.key}"
        if line.counters_apart:
            _check_apart(s, line)
        elif len(s.devices) > MAX_DEVICES:
            raise LimitError(f"{where}: {len(s.devices)} devices > {MAX_DEVICES}")
        shared = sum(len(cs["counters"]) for cs in s.shared_counters)
        if not line.counters_apart and shared > MAX_SHARED_COUNTERS:
            raise LimitError(f"{where}: {shared} shared counters > {MAX_SHARED_COUNTERS}")
        per_slice = 0
        for d in s.devices:
            name = d["name"]
            if not DNS_LABEL.fullmatch(name):
                raise LimitError(f"{where}: device name {name!r} is not a DNS label")
            if name in names:
                raise LimitError(f"{where}: device name {name!r} used twice in the pool")
            names.add(name)
            n = len(d.get("attributes", {})) + len(d.get("capacity", {}))
            if n > MAX_ATTRIBUTES_AND_CAPACITIES:
                raise LimitError(f"{where}: device {name}: {n} attributes+capacities > 32")
            for key, val in d.get("attributes", {}).items():
                ident = key.rsplit("/", 1)[-1]
                if not ATTRIBUTE_ID.fullmatch(ident):
                    raise LimitError(f"{where}: device {name}: bad attribute name {key!r}")
                for kind in ("string", "version"):
                    if kind in val and len(val[kind]) > MAX_VALUE_LENGTH:
                        raise LimitError(f"{where}: device {name}: {key} longer than 64")
            consumed = sum(len(c["counters"]) for c in d.get("consumesCounters", []))
            if consumed > MAX_COUNTERS_PER_DEVICE:
                raise LimitError(f"{where}: device {name}: consumes {consumed} counters > 32")
            per_slice += consumed
        if not line.counters_apart and per_slice > MAX_DEVICE_COUNTERS:
            raise LimitError(f"{where}: devices consume {per_slice} counters > 1024")


def _check_apart(s: SliceContent, line: Line) -> None:
    """What 1.35 and later check beyond 1.34's per-device rules."""
    where = f"slice {s.key}"
    if s.devices and s.shared_counters:
        raise LimitError(
            f"{where}: devices and counter sets in one slice (from 1.35 one or the other)"
        )
    sets = line.max_counter_sets
    if sets is not None and len(s.shared_counters) > sets:
        raise LimitError(f"{where}: {len(s.shared_counters)} counter sets > {sets}")
    for cs in s.shared_counters:
        if len(cs["counters"]) > MAX_COUNTERS_PER_SET:
            raise LimitError(f"{where}: counter set {cs['name']}: {len(cs['counters'])} > 32")
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in s.devices)
    limit = line.max_devices_counted_or_tainted if advanced else line.max_devices
    if len(s.devices) > limit:
        raise LimitError(f"{where}: {len(s.devices)} devices > {limit}")
    for d in s.devices:
        if len(d.get("consumesCounters", ())) > MAX_CONSUMPTIONS_PER_DEVICE:
            raise LimitError(f"{where}: device {d['name']}: consumes more than 2 counter sets")
