"""What one share of a device may use (pure), from the scheduler's consumedCapacity, the
device and the node's consumable-capacity mode (memory: what it consumed; shares=N: k/N
for k shares, unless the claim asked for memory or compute itself; unlimited: only what
it asked for; no compute consumed, no compute limit); and the node's oversubscription guard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from dradriver.api.quantity import QuantityError, parse
from dradriver.errors import ClaimStateError, DeviceError
from dradriver.inventory.node_devices import NodeDevice
from dradriver.kubeletplugin.prepare.claim_devices import PlannedDevice
from dradriver.kubeletplugin.state.records import Checkpoint, ClaimRef, PreparedDevice, Share
from dradriver.slices.consumable import COMPUTE, COMPUTE_WHOLE, MIB, Consumable, ConsumableMode


def _amount(consumed: Mapping[str, str], name: str, where: str) -> Fraction:
    text = consumed.get(name)
    if text is None:
        return Fraction(0)
    try:
        value = parse(text)
    except QuantityError as exc:
        raise ClaimStateError(
            f"{where}: consumedCapacity {name}={text!r} is not a quantity: {exc}",
            reason="bad_allocation",
        ) from exc
    if value < 0:
        raise ClaimStateError(
            f"{where}: consumedCapacity {name}={text} is negative", reason="bad_allocation"
        )
    return value


def device_memory(dev: NodeDevice) -> int:
    return dev.mig.memory_bytes if dev.mig is not None else dev.gpu.memory_bytes


def share_of(
    pd: PlannedDevice,
    dev: NodeDevice,
    *,
    mode: Consumable,
    where: str,
    pods: Sequence[str],
) -> Share:
    """The record of share `pd` of `dev`, for the claim reserved for `pods` (UIDs: whose
    cgroups get its memory as a limit, hardware/pod_memory.py). `where` names the claim
    and device for an error."""
    consumed = dict(pd.consumed)
    memory_bytes = device_memory(dev)
    memory = _amount(consumed, "memory", where)
    compute = _amount(consumed, COMPUTE, where)
    if memory > memory_bytes:
        raise ClaimStateError(
            f"{where}: the allocation consumes {consumed['memory']} of memory, more than "
            f"the device has ({memory_bytes} bytes); the claim must be allocated again",
            reason="bad_allocation",
        )
    if compute > COMPUTE_WHOLE:
        raise ClaimStateError(
            f"{where}: the allocation consumes compute {consumed[COMPUTE]}, more than "
            f"{COMPUTE_WHOLE}%; the claim must be allocated again",
            reason="bad_allocation",
        )
    memory_limit = int(memory) // MIB * MIB if memory else None
    compute_limit = int(compute) if compute else None
    if mode.mode is ConsumableMode.SHARES and mode.shares:
        held = _amount(consumed, "shares", where) or Fraction(1)
        part = min(held / mode.shares, Fraction(1))
        if memory_limit is None:
            memory_limit = int(memory_bytes * part) // MIB * MIB
        if compute_limit is None:
            compute_limit = max(1, int(COMPUTE_WHOLE * part))  # floor: never past 100
    return Share(pd.share_id, pd.consumed, memory_limit, compute_limit, pods=tuple(pods))


def check_room(
    cp: Checkpoint,
    ref: ClaimRef,
    shares: Sequence[tuple[PreparedDevice, NodeDevice]],
    *,
    mode: Consumable,
) -> None:
    """The node's own guard: the shares prepared on a device never consume more than it
    has, even when an allocation says otherwise (the 1.34 scheduler can: it checks the
    capacity left on another device of the slice than the one it allocates,
    kubernetes/kubernetes#133705)."""
    others = [od for o in cp.claims.values() if o.uid != ref.uid for od in o.devices]
    # One check per device, with all of this claim's shares of it.
    for dev in {dev.name: dev for _, dev in shares}.values():
        mine = [d.share for d, _ in shares if d.device == dev.name and d.share is not None]
        where = f"claim {ref}: device {dev.name}, share {mine[0].share_id}"
        held = mine + [
            od.share
            for od in others
            if od.device == dev.name and od.share is not None and not od.admin_access
        ]
        limits = {"memory": Fraction(device_memory(dev)), COMPUTE: Fraction(COMPUTE_WHOLE)}
        if mode.mode is ConsumableMode.SHARES:
            limits["shares"] = Fraction(mode.shares)
        for name, limit in limits.items():
            total = sum((_amount(dict(s.consumed), name, where) for s in held), Fraction(0))
            if total > limit:
                raise DeviceError(
                    f"{where}: with the {len(held) - len(mine)} shares already "
                    f"prepared on it, the device would give out {total} of its {limit} "
                    f"{name}: the allocation oversubscribes it (the Kubernetes 1.34 "
                    "scheduler can, kubernetes/kubernetes#133705); not prepared. Delete the "
                    "claim so it is allocated again",
                    reason="oversubscribed",
                )
