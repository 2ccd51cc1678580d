"""The prepare planner (pure): from what the kubelet sent, the ResourceClaim the API server
returned, the node's devices and the checkpoint to the claim's record (devices, configs,
sharing setup, MIG carve intents), or a typed per-claim error; execute.py applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dradriver.errors import ConfigError, DeviceError
from dradriver.inventory.naming import GpuIdentity
from dradriver.inventory.node_devices import NodeDevice
from dradriver.kubeletplugin.prepare.cdi import driver_device_id, qualified_name
from dradriver.kubeletplugin.prepare.channels import channel_device, check_one_domain, is_channel
from dradriver.kubeletplugin.prepare.claim_devices import (
    PlannedDevice,
    check_identity,
    claim_devices,
)
from dradriver.kubeletplugin.prepare.shares import check_room, share_of
from dradriver.kubeletplugin.state.records import (
    PREPARE_STARTED,
    Carve,
    Checkpoint,
    ClaimRecord,
    ClaimRef,
    MigIds,
    Mps,
    MpsLimits,
    PreparedDevice,
    Share,
    Sharing,
    TimeSlicing,
)
from dradriver.slices.consumable import OFF, Consumable


def sharing_for(ref: ClaimRef, pd: PlannedDevice, dev: NodeDevice) -> Sharing | None:
    """The sharing setup a device needs by its config; none unless a config says so.
    (The config models refuse what a device kind cannot have, quantities included.)"""
    if not pd.configs:
        return None
    # The config models (pydantic) load with the first claim that carries a config: most
    # claims have none, and the plugin's memory is a budget.
    from dradriver.api.config import effective

    try:
        cfg = effective(list(pd.configs), dev.kind.value, pd.request_name)
    except ConfigError as exc:
        raise ConfigError(f"claim {ref}: {exc}", reason="config") from exc
    if cfg is None or cfg.sharing is None:
        return None
    s = cfg.sharing
    if s.strategy == "TimeSlicing":
        return TimeSlicing(s.timeSlicingConfig.interval if s.timeSlicingConfig else "Default")
    mps = s.mpsConfig
    if mps is None:
        return Mps(MpsLimits())
    pinned = tuple(sorted((mps.defaultPerDevicePinnedMemoryLimit or {}).items()))
    limit = mps.defaultPinnedDeviceMemoryLimit
    return Mps(MpsLimits(mps.defaultActiveThreadPercentage, limit, pinned))


def carve_intent(dev: NodeDevice) -> Carve | None:
    """What a partition is to be carved as; None for a device that exists already."""
    if dev.partition is None:
        return None
    p = dev.partition.profile
    return Carve(
        dev.gpu.uuid, p.profile_id, p.name, dev.partition.start, p.memory_slices, p.compute_slices
    )


def check_exclusive(
    cp: Checkpoint,
    ref: ClaimRef,
    devs: list[tuple[NodeDevice, bool]],
    *,
    local: Mapping[str, NodeDevice],
) -> None:
    """A device (or the hardware under it) serves one claim at a time; a device given
    by adminAccess stands beside that claim, taking nothing from it; shares of a device
    that allows multiple allocations stand beside each other (`devs`: each device, and
    whether it is a share), never beside a claim that holds the device whole."""
    for other in cp.claims.values():
        if other.uid == ref.uid:
            continue
        for od in other.devices:
            if od.admin_access:
                continue
            theirs = local.get(od.device) or _same_hardware(od, local)
            for dev, shared in devs:
                if shared and od.share is not None and dev.name == od.device:
                    continue
                if dev.name == od.device or (theirs is not None and dev.overlaps(theirs)):
                    raise DeviceError(
                        f"claim {ref}: device {dev.name} is already prepared for claim "
                        f"{other.namespace}/{other.name} ({other.uid}); a device serves "
                        "one claim at a time",
                        reason="device_busy",
                    )


def _same_hardware(od: PreparedDevice, local: Mapping[str, NodeDevice]) -> NodeDevice | None:
    """The device a record prepared under a name this node no longer publishes (a driver
    upgrade renamed its MIG profile) stands on now: by UUID, or for a carved partition by
    its GPU, profile and placement, so that a claim prepared before the upgrade still
    keeps its hardware from claims allocated under the new names."""
    for dev in local.values():
        if od.carve is not None:
            c = od.carve
            if (
                dev.partition is not None
                and dev.gpu.uuid == c.gpu_uuid
                and dev.partition.profile.profile_id == c.profile_id
                and dev.partition.start == c.placement_start
            ):
                return dev
        elif od.uuid is not None and dev.uuid == od.uuid:
            return dev
    return None


def _mig_ids(dev: NodeDevice) -> MigIds | None:
    return MigIds(dev.mig.gpu_instance_id, dev.mig.compute_instance_id) if dev.mig else None


def admin_view(ref: ClaimRef, dev: NodeDevice, cp: Checkpoint) -> tuple[str | None, MigIds | None]:
    """The UUID and MIG ids a device given by adminAccess (KEP-5018: monitoring and
    diagnostics beside the claim that holds it) is reached by: nothing is carved,
    switched or shared for it. A MIG partition exists only while a claim holds it
    carved; admin access reaches that MIG device."""
    if dev.partition is None:
        return dev.uuid, _mig_ids(dev)
    holder = next(
        (
            d
            for r in cp.claims.values()
            for d in r.devices
            if d.device == dev.name and not d.admin_access and d.carve and d.carve.created
        ),
        None,
    )
    ids = holder.mig_ids() if holder is not None else None
    if holder is None or ids is None:
        raise DeviceError(
            f"claim {ref}: adminAccess to {dev.name}: this MIG partition is not carved "
            "(no claim holds it), so there is no MIG device to give",
            reason="not_carved",
        )
    return holder.uuid, MigIds(*ids)


def plan(
    claim: dict[str, Any],
    ref: ClaimRef,
    *,
    driver: str,
    node: str,
    devices: Mapping[str, NodeDevice],
    checkpoint: Checkpoint,
    now: float,
    consumable: Consumable = OFF,
    name_book: Mapping[str, GpuIdentity] | None = None,
    channels: bool = False,
    driver_files: bool = False,
) -> ClaimRecord:
    """The record of everything prepare does for `claim`, in state PrepareStarted: the
    devices with their request names, GPU minors, MIG ids or carve intents, and sharing
    setups, nothing applied yet. `name_book`: the name book (which GPU each name was
    published for); `channels`: the node publishes IMEX channels; `driver_files`: a GPU
    device also names the node's driver spec (--driver-files cdi). Raises a typed
    DriverError for a claim this node cannot prepare."""
    cd = claim_devices(claim, ref, driver, pool=node)
    records: dict[tuple[str, str], PreparedDevice] = {}
    for pd in cd.devices:
        if channels and pd.device not in devices and is_channel(pd.device):
            records[(pd.device, "")] = channel_device(
                ref, driver, node, request=pd.request_name, device=pd.device, configs=pd.configs
            )
            continue
        dev = devices.get(pd.device)
        check_identity(ref, pd.device, dev, name_book=name_book or {}, devices=devices)
        assert dev is not None  # check_identity raised otherwise
        key = (pd.device, pd.share_id)
        rec = records.get(key)
        if rec is not None:
            if pd.request_name not in rec.request_names:
                rec.request_names.append(pd.request_name)
            continue
        carve, sharing, share = None, None, None
        if pd.admin_access:
            uuid, mig = admin_view(ref, dev, checkpoint)
            share = Share(pd.share_id, pd.consumed) if pd.share_id else None
        else:
            uuid, mig, carve = dev.uuid, _mig_ids(dev), carve_intent(dev)
            sharing = sharing_for(ref, pd, dev)
            if pd.share_id:
                where = f"claim {ref}: device {dev.name}, share {pd.share_id}"
                if sharing is not None:
                    raise ConfigError(
                        f"{where}: {'an MPS' if isinstance(sharing, Mps) else 'a time-slicing'}"
                        " config applies to a device held whole; a share runs beside the "
                        "device's other shares with the limits of its allocation. Drop the "
                        "sharing config (claim or DeviceClass) for this request",
                        reason="config",
                    )
                share = share_of(pd, dev, mode=consumable, where=where, pods=cd.pod_uids)
        out = PreparedDevice(
            request_names=[pd.request_name],
            pool=node,
            device=dev.name,
            cdi_device_ids=[],
            uuid=uuid,
            kind=dev.kind.value,
            minor=dev.gpu.minor,
            carve=carve,
            mig=mig,
            sharing=sharing,
            admin_access=pd.admin_access,
            share=share,
        )
        # The device's own ID first: the kubelet names a device by its first CDI ID in the
        # pod's allocatedResourcesStatus (pkg/kubelet/cm/dra/manager.go, 1.34 to 1.37), where
        # the API server refuses a duplicate within a claim, and 1.36+ keeps the first of
        # each; the driver's ID, the same for every GPU, must not come first. The runtime
        # applies the driver spec's edits once per container whatever the order.
        own = qualified_name(driver, out.cdi_name, ref.uid)
        ids = [own, driver_device_id(driver)] if driver_files else [own]
        records[key] = replace(out, cdi_device_ids=ids)
    held = [r for r in records.values() if not r.admin_access]
    exclusive = [(devices[r.device], r.share is not None) for r in held if r.imex is None]
    check_exclusive(checkpoint, ref, exclusive, local=devices)
    # A claim of no channel or share runs nothing of channels.py or shares.py (the walk a
    # reader takes, tests/unit/test_walk.py).
    imex = [r for r in held if r.imex is not None]
    if imex:
        check_one_domain(checkpoint, ref, imex)
    shared = [(r, devices[r.device]) for r in held if r.share]
    if shared:
        check_room(checkpoint, ref, shared, mode=consumable)
    return ClaimRecord(
        ref.uid,
        ref.namespace,
        ref.name,
        PREPARE_STARTED,
        devices=list(records.values()),
        updated_at=now,
    )
