"""Device health, the pure part: what NVML reported (events, probes) -> each GPU's health,
and each published device's health. No I/O: the NVML edge (monitor.py) turns events and
probes into the observations below; publishing, the kubelet's health stream, metrics and
events read the result.

Rules:
- An XID on the skip list is an application's fault, not the device's: it changes nothing.
- Any other XID, a double-bit ECC event, or a probe that finds the GPU lost (or a row
  remapping / page retirement pending) makes the GPU unhealthy. The first fault's reason
  is kept until the GPU recovers, so a burst of events is one change, not several.
  One exception: XID 79 ("GPU has fallen off the bus") names the cause of a probe's
  "lost", which a probe often sees moments before the driver reports the XID; it
  replaces "lost" (the time stays the first fault's), so the taint says what the driver
  said.
- An XID that NVML ties to one GPU instance makes only that instance's devices unhealthy.
- MIG devices (and MIG partitions) inherit their parent GPU's health.
- A GPU recovers after `recovery_probes` probes in a row that find nothing wrong; a probe
  that cannot tell (NVML errors) makes a fault-free GPU Unknown, and counts for nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from dradriver.inventory.node_devices import DeviceKind, NodeDevice

# The NVIDIA device plugin's default skip list: XIDs an application causes (13 graphics
# engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout); see NVIDIA's XID
# catalogue (docs.nvidia.com/deploy/xid-errors) and the device plugin's health checks.
DEFAULT_SKIP_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVERY_PROBES = 3

LOST = "lost"
ECC_DBE = "ecc-dbe"
# NVIDIA's XID catalogue: "GPU has fallen off the bus", what a probe sees as lost.
XID_FELL_OFF_THE_BUS = 79


class Health(enum.StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class HealthConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Instance:
    """A GPU instance, by what names it across its lifetime and our device names: its
    profile and placement (NVML's GPU-instance IDs are reused)."""

    profile_id: int
    placement_start: int


@dataclass(frozen=True)
class Fault:
    reason: str  # the taint's value: "xid-79", "lost", "ecc-dbe", "row-remap-pending"
    since: int  # Unix seconds: the taint's timeAdded
    xid: int | None = None


@dataclass(frozen=True)
class XidEvent:
    uuid: str  # the GPU's
    xid: int
    instance: Instance | None = None  # set when NVML ties the XID to a GPU instance


@dataclass(frozen=True)
class EccEvent:
    """A double-bit (uncorrectable) ECC error event."""

    uuid: str


@dataclass(frozen=True)
class Probe:
    """One periodic look at a GPU. `problem`: a fault reason ("lost", ...); `unknown`:
    why the probe could not tell. Both empty: nothing wrong."""

    uuid: str
    problem: str = ""
    unknown: str = ""


Observation = XidEvent | EccEvent | Probe


@dataclass(frozen=True)
class Policy:
    skip_xids: frozenset[int] = DEFAULT_SKIP_XIDS
    recovery_probes: int = DEFAULT_RECOVERY_PROBES

    def __post_init__(self) -> None:
        if self.recovery_probes < 1:
            raise HealthConfigError(
                f"health layer: --health-recovery-probes must be at least 1, not "
                f"{self.recovery_probes}"
            )


def parse_xids(value: str) -> frozenset[int]:
    """--health-skip-xids: comma-separated XID numbers; empty: skip none."""
    out: set[int] = set()
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise HealthConfigError(
                f"health layer: --health-skip-xids {value!r}: {part!r} is not an XID "
                "number; give comma-separated numbers such as 13,31,43,45,68,109"
            )
        out.add(int(part))
    return frozenset(out)


@dataclass(frozen=True)
class GpuHealth:
    fault: Fault | None = None  # the whole GPU's
    instances: tuple[tuple[Instance, Fault], ...] = ()  # faults of single GPU instances
    good_probes: int = 0  # clean probes in a row since the last fault
    unknown: str = ""  # why the last probe could not tell; "" when it could

    @property
    def health(self) -> Health:
        if self.fault is not None:
            return Health.UNHEALTHY
        return Health.UNKNOWN if self.unknown else Health.HEALTHY

    @property
    def faulty(self) -> bool:
        return self.fault is not None or bool(self.instances)

    def instance_fault(self, inst: Instance) -> Fault | None:
        return next((f for i, f in self.instances if i == inst), None)


@dataclass(frozen=True)
class Transition:
    """What one observation changed, for logs, events and metrics."""

    uuid: str
    before: GpuHealth
    after: GpuHealth
    observation: Observation

    @property
    def recovered(self) -> bool:
        return self.before.faulty and not self.after.faulty


@dataclass
class HealthBook:
    """Every GPU's health. Mutable, not thread-safe: its owner serialises access."""

    policy: Policy = field(default_factory=Policy)
    gpus: dict[str, GpuHealth] = field(default_factory=dict)

    def get(self, uuid: str) -> GpuHealth:
        return self.gpus.get(uuid, GpuHealth())

    def observe(self, obs: Observation, now: int) -> Transition | None:
        """Applies one observation; the transition if the GPU's health state changed."""
        before = self.get(obs.uuid)
        after = _next(before, obs, self.policy, now=now)
        if after == before:
            return None
        if after == GpuHealth():
            self.gpus.pop(obs.uuid, None)
        else:
            self.gpus[obs.uuid] = after
        # A clean probe only counting towards recovery is no change anyone must hear of.
        if _visible(before) == _visible(after):
            return None
        return Transition(obs.uuid, before, after, obs)


def _visible(g: GpuHealth) -> tuple[object, ...]:
    return (g.fault, g.instances, g.health)


def _next(g: GpuHealth, obs: Observation, policy: Policy, *, now: int) -> GpuHealth:
    if isinstance(obs, XidEvent):
        if obs.xid in policy.skip_xids:
            return g
        fault = Fault(f"xid-{obs.xid}", now, obs.xid)
        if obs.xid == XID_FELL_OFF_THE_BUS and g.fault is not None and g.fault.reason == LOST:
            return replace(g, fault=replace(fault, since=g.fault.since), good_probes=0)
        if obs.instance is not None and g.fault is None:
            if g.instance_fault(obs.instance) is not None:
                return replace(g, good_probes=0)
            return replace(g, instances=(*g.instances, (obs.instance, fault)), good_probes=0)
        return replace(g, fault=g.fault or fault, good_probes=0)
    if isinstance(obs, EccEvent):
        return replace(g, fault=g.fault or Fault(ECC_DBE, now), good_probes=0)
    if obs.problem:
        return replace(g, fault=g.fault or Fault(obs.problem, now), good_probes=0, unknown="")
    if obs.unknown:
        return replace(g, unknown=obs.unknown)
    if not g.faulty:
        return replace(g, unknown="", good_probes=0)
    good = g.good_probes + 1
    if good >= policy.recovery_probes:
        return GpuHealth()
    return replace(g, good_probes=good, unknown="")


@dataclass(frozen=True)
class DeviceHealth:
    health: Health
    fault: Fault | None = None


HEALTHY = DeviceHealth(Health.HEALTHY)


def device_instance(dev: NodeDevice) -> Instance | None:
    """The GPU instance a MIG device or partition is (or will be) carved as."""
    if dev.kind is DeviceKind.GPU:
        return None
    profile, start = dev.profile, dev.placement_start
    if dev.mig is not None:
        return Instance(dev.mig.profile_id, dev.mig.placement_start)
    if profile is None or start is None:
        return None
    return Instance(profile.profile_id, start)


def device_health(book: HealthBook, devices: Iterable[NodeDevice]) -> dict[str, DeviceHealth]:
    """Each published device's health, by device name."""
    out: dict[str, DeviceHealth] = {}
    for dev in devices:
        g = book.get(dev.gpu.uuid)
        if g.fault is not None:
            out[dev.name] = DeviceHealth(Health.UNHEALTHY, g.fault)
            continue
        inst = device_instance(dev)
        fault = g.instance_fault(inst) if inst is not None else None
        if fault is not None:
            out[dev.name] = DeviceHealth(Health.UNHEALTHY, fault)
        else:
            out[dev.name] = DeviceHealth(g.health)
    return out


def unhealthy(health: Mapping[str, DeviceHealth]) -> dict[str, Fault]:
    return {n: h.fault for n, h in health.items() if h.fault is not None}
