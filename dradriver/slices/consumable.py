"""Consumable capacity (KEP-5075, the DRAConsumableCapacity gate): a device published with
`allowMultipleAllocations` goes to several claims at once, each consuming part of its
capacity; the scheduler packs them and records each allocation's shareID and
consumedCapacity. Pure: the mode from its flag, and the fields a device gets in it.

The modes (`--consumable-capacity`):

- off: devices are published as before, byte for byte; one claim per device.
- memory: a claim consumes the memory it asks for (all of it when it asks for nothing)
  and the compute it asks for (none when it asks for nothing).
- shares=N: a `shares` capacity of N, one per claim unless it asks for more; memory and
  compute only when asked for.
- unlimited: any number of claims; memory and compute only when asked for.

Why these numbers:

- Memory in steps of 1Mi from 1Gi. 1Mi is the unit NVML and nvidia-smi report memory in
  and the unit of MPS's pinned-memory limit, so "the whole device" is a valid amount
  (an 80 GB H100's 81559Mi) and a user's 20Gi or 512Mi is taken as written, never
  rounded. In memory mode the least a claim gets is 1Gi: a CUDA context alone takes some
  300-500 MiB, so less would be a share no process can use. The other modes consume no
  memory unless asked, so their minimum is 0.
- Compute as `compute`, a percentage of the device's multiprocessors (SMs), 100 a device
  and 1 a step: the unit of MPS's active-thread limit, which is what enforces it, and
  the only one a whole GPU can be counted in here (NVML gives the SM count of MIG
  devices only: nvmlDeviceGetAttributes answers MIG device handles). The default is 0,
  because a claim that asks for memory alone must not take all the compute from the
  claims after it (1.34 consumes a capacity without a requestPolicy entirely). A
  `multiprocessors` capacity, where a device has one, gets the same default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from dradriver.inventory.node_devices import MigMode

MIB = 2**20
GIB = 2**30
MEMORY_MIN = GIB  # memory mode's least share; see the module docstring
FLAG = "--consumable-capacity"


class ConsumableMode(enum.StrEnum):
    OFF = "off"
    MEMORY = "memory"
    SHARES = "shares"
    UNLIMITED = "unlimited"


class ConsumableModeError(ValueError):
    """A mode that cannot be parsed or cannot work with the other flags; the message
    names the flags and the fix."""


@dataclass(frozen=True)
class Consumable:
    mode: ConsumableMode = ConsumableMode.OFF
    shares: int = 0  # N of shares=N

    @property
    def on(self) -> bool:
        return self.mode is not ConsumableMode.OFF

    def __str__(self) -> str:
        if self.mode is ConsumableMode.SHARES:
            return f"shares={self.shares}"
        return self.mode.value


OFF = Consumable()

# A Device's capacity map holds at most 32 attributes and capacities together; N beyond
# this would be a typo, and MPS serves at most 48 clients a GPU (Volta and later).
MAX_SHARES = 48


def parse_mode(value: str) -> Consumable:
    text = value.strip()
    if text in ("", "off"):
        return Consumable()
    if text in (ConsumableMode.MEMORY.value, ConsumableMode.UNLIMITED.value):
        return Consumable(ConsumableMode(text))
    name, eq, n = text.partition("=")
    if name == "shares" and eq:
        if n.isdigit() and 1 <= int(n) <= MAX_SHARES:
            return Consumable(ConsumableMode.SHARES, int(n))
        raise ConsumableModeError(
            f"{FLAG}={text}: N in shares=N must be a whole number from 1 to {MAX_SHARES} "
            f"(MPS serves at most {MAX_SHARES} clients a GPU)"
        )
    raise ConsumableModeError(
        f"{FLAG}={text}: expected off, memory, shares=N or unlimited "
        "(env DRADRIVER_CONSUMABLE_CAPACITY, Helm kubeletPlugin.consumableCapacity)"
    )


def check_mig_mode(c: Consumable, mig_mode: MigMode) -> None:
    """Refuses what 1.34 cannot do safely. In dynamic MIG mode a whole GPU and its
    partitions draw on one counter set, but the 1.34 allocator counts a device's counters
    only while it is allocated exclusively: the shares of a device that allows multiple
    allocations do not count (v0.34.4 structured/internal/experimental, available
    counters are summed over AllocatedDevices, which holds no shared device), so
    partitions of a GPU whose shares run would be allocated and carved beside them."""
    if c.on and mig_mode is MigMode.DYNAMIC:
        raise ConsumableModeError(
            f"{FLAG}={c} cannot be combined with --mig-mode=dynamic: in Kubernetes 1.34 "
            "the scheduler does not count a shared GPU's counters once it is allocated, "
            "so it would carve MIG partitions of a GPU that shares are running on. Use "
            "--mig-mode=none or static with consumable capacity, or "
            f"{FLAG}=off with dynamic MIG"
        )


def _policy(default: str, minimum: str, step: str | None = None) -> dict[str, Any]:
    rng: dict[str, Any] = {"min": minimum}
    if step is not None:
        rng["step"] = step
    return {"default": default, "validRange": rng}


def _mib(n_bytes: int) -> str:
    return f"{n_bytes // MIB}Mi"


COMPUTE = "compute"  # percent of the device's SMs
COMPUTE_WHOLE = 100


def capacity(c: Consumable, memory_bytes: int, multiprocessors: int | None) -> dict[str, Any]:
    """A device's capacity map in mode `c` (not off): every capacity gets a requestPolicy,
    since one without consumes the whole capacity for a claim that does not name it."""
    whole = memory_bytes // MIB * MIB  # 1Mi steps: the default must be one of them
    if c.mode is ConsumableMode.MEMORY:
        memory = _policy(_mib(whole), _mib(MEMORY_MIN), "1Mi")
        if whole < MEMORY_MIN:  # smaller than the least share: one share of it all
            memory = _policy(_mib(whole), _mib(whole))
    else:
        memory = _policy("0", "0", "1Mi")
    cap: dict[str, Any] = {
        "memory": {"value": str(memory_bytes), "requestPolicy": memory},
        COMPUTE: {"value": str(COMPUTE_WHOLE), "requestPolicy": _policy("0", "0", "1")},
    }
    if multiprocessors is not None:
        cap["multiprocessors"] = {
            "value": str(multiprocessors),
            "requestPolicy": _policy("0", "0", "1"),
        }
    if c.mode is ConsumableMode.SHARES:
        # 1.34 wants min + step within the capacity: shares=1 gets no step.
        step = "1" if c.shares > 1 else None
        shares = _policy("1", "1", step)
        shares["validRange"]["max"] = str(c.shares)
        cap["shares"] = {"value": str(c.shares), "requestPolicy": shares}
    return cap


def from_flags(value: str, mig_mode: str) -> Consumable:
    """--consumable-capacity, checked against --mig-mode; ConsumableModeError names both."""
    c = parse_mode(value)
    check_mig_mode(c, MigMode(mig_mode))
    return c
