"""The fake node's GPUs and their mutable state: MIG mode, GPU and compute instances,
compute mode, lost GPUs. Every rule NVML enforces is enforced here, through mig_rules;
operations fail by raising NvmlReturn with the code NVML returns.

Codes chosen (from the NVML reference where it says, else what drivers do):
- MIG call on a product without MIG: NOT_SUPPORTED.
- Create/list instances while MIG mode is not enabled: NOT_SUPPORTED (the reference's
  "device doesn't have MIG mode enabled"); profile info and possible placements work
  on a MIG-capable GPU whatever its mode ("regardless of whether MIG is enabled").
- Unknown profile ID, or a placement that is not one of the profile's possible
  placements: INVALID_ARGUMENT.
- Placement overlapping another instance, compute slices exhausted, a second +me
  instance, the profile's instance count reached: INSUFFICIENT_RESOURCES.
- Destroying a GPU instance that still has compute instances, or disabling MIG while
  GPU instances exist: IN_USE.
- Enabling MIG on Ampere: the call succeeds, the mode stays pending and the activation
  status is RESET_REQUIRED; Hopper switches at once (activation status SUCCESS).
- A stale GPU/compute instance or MIG device handle: INVALID_ARGUMENT.
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from fakenvml import mig_rules, persist, returns
from fakenvml.events import NO_INSTANCE, Event, EventHub
from fakenvml.faults import Faults
from fakenvml.products import CI_PROFILES, ComputeInstanceProfile, GpuInstanceProfile
from fakenvml.returns import NvmlReturn
from fakenvml.spec import MachineSpec
from fakenvml.topology import GpuLayout, build, mig_uuid

DEFAULT_DRIVER_VERSION = "570.86.15"
DEFAULT_CUDA_DRIVER_VERSION = 12080
MAX_MIG_DEVICES = 7

MIG_DISABLE: int = pynvml.NVML_DEVICE_MIG_DISABLE
MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
_COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT,
    pynvml.NVML_COMPUTEMODE_PROHIBITED,
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
}


class FakeStateError(ValueError):
    pass


@dataclass
class ComputeInstance:
    id: int
    profile: ComputeInstanceProfile
    start: int
    uuid: str


@dataclass
class GpuInstance:
    id: int
    profile: GpuInstanceProfile
    start: int
    compute_instances: dict[int, ComputeInstance] = field(default_factory=dict)


@dataclass
class FakeGpu:
    layout: GpuLayout
    mig_current: int = MIG_DISABLE
    mig_pending: int = MIG_DISABLE
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    gpu_instances: dict[int, GpuInstance] = field(default_factory=dict)
    lost: bool = False
    # An uncorrectable memory error waits for the next GPU reset to remap its row
    # (nvmlDeviceGetRemappedRows' isPending); see faults.py.
    remap_pending: bool = False
    mig_serial: int = 0  # compute instances ever created here; makes MIG UUIDs fresh

    @property
    def index(self) -> int:
        return self.layout.index

    @property
    def uuid(self) -> str:
        return self.layout.uuid

    @property
    def mig_enabled(self) -> bool:
        return self.mig_current == MIG_ENABLE

    def placed(self) -> list[mig_rules.Placed]:
        return [(gi.profile, gi.start) for gi in self.gpu_instances.values()]

    def mig_devices(self) -> list[tuple[GpuInstance, ComputeInstance]]:
        """In MIG device index order."""
        return [
            (gi, gi.compute_instances[ci_id])
            for gi in sorted(self.gpu_instances.values(), key=lambda g: g.id)
            for ci_id in sorted(gi.compute_instances)
        ]


class FakeMachine:
    def __init__(
        self,
        spec: MachineSpec,
        *,
        node: str,
        state_dir: Path | None = None,
        driver_version: str | None = None,
        cuda_driver_version: int | None = None,
    ) -> None:
        self.node = node
        self.spec = spec
        self.driver_version = driver_version or spec.driver_version or DEFAULT_DRIVER_VERSION
        self.cuda_driver_version = (
            cuda_driver_version or spec.cuda_driver_version or DEFAULT_CUDA_DRIVER_VERSION
        )
        self.lock = threading.RLock()
        self.events = EventHub(self.lock)
        self.faults = Faults(self)
        self.tag = zlib.crc32(f"{node}/{id(self)}".encode()) & 0xFFFF or 1
        self.gpus = [FakeGpu(layout) for layout in build(spec, node)]
        self.state_path = persist.state_path(state_dir, node) if state_dir else None
        saved = persist.load(self.state_path) if self.state_path else None
        if saved is not None:
            self._restore(saved)
        else:
            self._power_on()
            self._save()

    # -- lookups ------------------------------------------------------------------

    def gpu(self, index: int) -> FakeGpu:
        """A GPU that answers calls: INVALID_ARGUMENT past the end, GPU_IS_LOST if lost."""
        if not 0 <= index < len(self.gpus):
            raise NvmlReturn(returns.INVALID_ARGUMENT, f"no GPU {index}")
        g = self.gpus[index]
        if g.lost:
            raise NvmlReturn(returns.GPU_IS_LOST, f"GPU {index} has fallen off the bus")
        return g

    def mig_gpu(self, index: int) -> FakeGpu:
        g = self.gpu(index)
        if not g.layout.product.mig_capable:
            raise NvmlReturn(returns.NOT_SUPPORTED, f"{g.layout.product.key} has no MIG")
        return g

    def gpu_instance(self, index: int, gi_id: int) -> GpuInstance:
        gi = self.mig_gpu(index).gpu_instances.get(gi_id)
        if gi is None:
            raise NvmlReturn(returns.INVALID_ARGUMENT, f"GPU {index} has no GPU instance {gi_id}")
        return gi

    def compute_instance(self, index: int, gi_id: int, ci_id: int) -> ComputeInstance:
        ci = self.gpu_instance(index, gi_id).compute_instances.get(ci_id)
        if ci is None:
            raise NvmlReturn(returns.INVALID_ARGUMENT, f"no compute instance {gi_id}/{ci_id}")
        return ci

    # -- MIG ------------------------------------------------------------------------

    def set_mig_mode(self, index: int, mode: int) -> int:
        """Returns the activation status nvmlDeviceSetMigMode reports."""
        with self.lock:
            g = self.mig_gpu(index)
            if mode not in (MIG_DISABLE, MIG_ENABLE):
                raise NvmlReturn(returns.INVALID_ARGUMENT, f"MIG mode {mode}")
            if mode == MIG_DISABLE and g.gpu_instances:
                raise NvmlReturn(returns.IN_USE, "GPU instances exist")
            g.mig_pending = mode
            status = returns.SUCCESS
            if g.layout.product.mig_switch_without_reset:
                g.mig_current = mode
            elif mode != g.mig_current:
                status = returns.RESET_REQUIRED
            self._save()
            return status

    def create_gpu_instance(
        self, index: int, profile_id: int, start: int | None, size: int | None = None
    ) -> GpuInstance:
        """start None: NVML picks the placement (the highest free one, as drivers do)."""
        with self.lock:
            g = self.mig_gpu(index)
            if not g.mig_enabled:
                raise NvmlReturn(returns.NOT_SUPPORTED, "MIG mode is not enabled")
            profile = g.layout.product.gi_profile_by_id(profile_id)
            if profile is None:
                raise NvmlReturn(returns.INVALID_ARGUMENT, f"no GPU instance profile {profile_id}")
            if start is None:
                free = mig_rules.free_placements(g.placed(), profile)
                if not free:
                    raise NvmlReturn(returns.INSUFFICIENT_RESOURCES, f"no room for {profile.name}")
                start = free[-1]
            if start not in profile.placement_starts or size not in (None, profile.memory_slices):
                raise NvmlReturn(
                    returns.INVALID_ARGUMENT, f"{profile.name} cannot be placed at {start}:{size}"
                )
            why = mig_rules.violation_adding(g.placed(), (profile, start))
            if why is not None:
                raise NvmlReturn(returns.INSUFFICIENT_RESOURCES, why.value)
            gi = GpuInstance(mig_rules.gpu_instance_id(profile, start), profile, start)
            g.gpu_instances[gi.id] = gi
            self._save()
            return gi

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        with self.lock:
            gi = self.gpu_instance(index, gi_id)
            if gi.compute_instances:
                raise NvmlReturn(returns.IN_USE, "the GPU instance has compute instances")
            del self.gpus[index].gpu_instances[gi_id]
            self._save()

    @staticmethod
    def ci_profile(gi: GpuInstance, profile_id: int) -> ComputeInstanceProfile | None:
        """A compute-instance profile that fits inside `gi`."""
        p = CI_PROFILES.get(profile_id)
        return p if p is not None and p.slices <= gi.profile.compute_slices else None

    @staticmethod
    def ci_placements(gi: GpuInstance, profile: ComputeInstanceProfile) -> list[int]:
        return list(range(0, gi.profile.compute_slices - profile.slices + 1, profile.slices))

    @classmethod
    def free_ci_placements(cls, gi: GpuInstance, profile: ComputeInstanceProfile) -> list[int]:
        """Starts where a compute instance of `profile` fits beside the existing ones."""
        used = {
            s
            for ci in gi.compute_instances.values()
            for s in range(ci.start, ci.start + ci.profile.slices)
        }
        return [
            s
            for s in cls.ci_placements(gi, profile)
            if not used & set(range(s, s + profile.slices))
        ]

    def create_compute_instance(
        self, index: int, gi_id: int, profile_id: int, start: int | None, size: int | None = None
    ) -> ComputeInstance:
        with self.lock:
            g = self.mig_gpu(index)
            gi = self.gpu_instance(index, gi_id)
            profile = self.ci_profile(gi, profile_id)
            if profile is None:
                raise NvmlReturn(returns.INVALID_ARGUMENT, f"no compute profile {profile_id}")
            starts = self.ci_placements(gi, profile)
            if start is not None and (start not in starts or size not in (None, profile.slices)):
                raise NvmlReturn(returns.INVALID_ARGUMENT, f"compute placement {start}")
            free = self.free_ci_placements(gi, profile)
            if start is None:
                start = free[0] if free else None
            if start is None or start not in free:
                raise NvmlReturn(returns.INSUFFICIENT_RESOURCES, "compute slices in use")
            ci_id = next(i for i in range(MAX_MIG_DEVICES + 1) if i not in gi.compute_instances)
            g.mig_serial += 1
            ci = ComputeInstance(
                ci_id, profile, start, mig_uuid(g.uuid, gi.id, ci_id, g.mig_serial)
            )
            gi.compute_instances[ci_id] = ci
            self._save()
            return ci

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        with self.lock:
            self.compute_instance(index, gi_id, ci_id)
            del self.gpus[index].gpu_instances[gi_id].compute_instances[ci_id]
            self._save()

    # -- other settings -----------------------------------------------------------

    def set_compute_mode(self, index: int, mode: int) -> None:
        with self.lock:
            g = self.gpu(index)
            if mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD:
                raise NvmlReturn(returns.NOT_SUPPORTED, "EXCLUSIVE_THREAD was removed")
            if mode not in _COMPUTE_MODES:
                raise NvmlReturn(returns.INVALID_ARGUMENT, f"compute mode {mode}")
            g.compute_mode = mode
            self._save()

    # -- hardware events ------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        with self.lock:
            self.gpus[index].lost = True
            self._save()

    def set_remap_pending(self, index: int) -> None:
        with self.lock:
            self.gpus[index].remap_pending = True
            self._save()

    def post_event(
        self,
        index: int,
        event_type: int,
        data: int,
        *,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        if not 0 <= index < len(self.gpus):
            raise IndexError(f"no GPU {index}")
        self.events.post(
            Event(
                index,
                event_type,
                data,
                NO_INSTANCE if gpu_instance_id is None else gpu_instance_id,
                NO_INSTANCE if compute_instance_id is None else compute_instance_id,
            )
        )

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: pending MIG mode takes effect, MIG instances and settings are gone
        (they do not survive a reset on real GPUs either), a lost GPU is back."""
        with self.lock:
            g = self.gpus[index]
            g.mig_current = g.mig_pending
            g.gpu_instances.clear()
            g.compute_mode = pynvml.NVML_COMPUTEMODE_DEFAULT
            g.lost = False
            g.remap_pending = False
            self._save()

    def reboot(self) -> None:
        with self.lock:
            for g in self.gpus:
                self.reset_gpu(g.index)

    # -- initial state and persistence --------------------------------------------

    def _power_on(self) -> None:
        first = 0  # NVML index of the group's first GPU
        for group in self.spec.groups:
            present = group.present
            for i in range(first, first + len(present)):
                if group.mig:
                    self.gpus[i].mig_current = self.gpus[i].mig_pending = MIG_ENABLE
            for d in group.mig_devices:
                index = first + present.index(d.gpu)
                profile = group.product.gi_profile_by_name(d.profile)
                assert profile is not None  # spec.parse checked it
                gi = self.create_gpu_instance(index, profile.id, d.placement)
                sizes = d.compute_instances
                if sizes is None:
                    sizes = (profile.compute_slices,)
                for size in sizes:
                    ci_profile = next(c for c in CI_PROFILES.values() if c.slices == size)
                    self.create_compute_instance(index, gi.id, ci_profile.id, None)
            first += len(present)

    def _save(self) -> None:
        if self.state_path is None:
            return
        persist.save(
            self.state_path,
            {
                "node": self.node,
                "driverVersion": self.driver_version,
                "gpus": [_dump(g) for g in self.gpus],
            },
        )

    def upgrade_driver(self, version: str) -> str:
        """Another driver installed and loaded, as after an upgrade (its files are the
        test's to lay out: fakenvml.driver_root); returns the version it replaced. Kept
        across restarts of the process, as an installed driver is."""
        with self.lock:
            old, self.driver_version = self.driver_version, version
            self._save()
        return old

    def _restore(self, doc: dict[str, Any]) -> None:
        saved = doc.get("gpus")
        where = f"fake NVML state {self.state_path}"
        if isinstance(doc.get("driverVersion"), str) and doc["driverVersion"]:
            self.driver_version = doc["driverVersion"]  # an upgrade since the spec was written
        by_uuid = {
            s.get("uuid"): s
            for s in (saved if isinstance(saved, list) else [])
            if isinstance(s, dict)
        }
        # A GPU gone from its slot (absent=) leaves the others' state as it was, as
        # hardware does; a GPU that came (back) powers on. A file that knows none of
        # this spec's GPUs belongs to another machine.
        if not any(g.uuid in by_uuid for g in self.gpus):
            raise FakeStateError(
                f"{where} describes other GPUs than this device spec; delete the file or "
                "use another state directory"
            )
        try:
            for g in self.gpus:
                s = by_uuid.get(g.uuid)
                if s is None:
                    if self.spec.groups[g.layout.group].mig:  # powered on fresh
                        g.mig_current = g.mig_pending = MIG_ENABLE
                    continue
                if s.get("product") != g.layout.product.key:
                    raise ValueError(f"GPU {g.uuid} saved as {s.get('product')}")
                _load_into(g, s)
        except (KeyError, TypeError, ValueError) as exc:
            raise FakeStateError(f"{where} is damaged ({exc!r}); delete it") from None


def _dump(g: FakeGpu) -> dict[str, Any]:
    return {
        "uuid": g.uuid,
        "product": g.layout.product.key,
        "migCurrent": g.mig_current,
        "migPending": g.mig_pending,
        "computeMode": g.compute_mode,
        "migSerial": g.mig_serial,
        # A GPU off the bus stays off it across a plugin restart, as hardware does.
        "lost": g.lost,
        "remapPending": g.remap_pending,
        "gpuInstances": [
            {
                "id": gi.id,
                "profileId": gi.profile.id,
                "start": gi.start,
                "computeInstances": [
                    {"id": ci.id, "profileId": ci.profile.id, "start": ci.start, "uuid": ci.uuid}
                    for ci in gi.compute_instances.values()
                ],
            }
            for gi in g.gpu_instances.values()
        ],
    }


def _load_into(g: FakeGpu, s: dict[str, Any]) -> None:
    g.mig_current = int(s["migCurrent"])
    g.mig_pending = int(s["migPending"])
    g.compute_mode = int(s["computeMode"])
    g.mig_serial = int(s["migSerial"])
    g.lost = bool(s.get("lost", False))  # absent from files written before faults persisted
    g.remap_pending = bool(s.get("remapPending", False))
    for raw in s["gpuInstances"]:
        profile = g.layout.product.gi_profile_by_id(int(raw["profileId"]))
        if profile is None:
            raise ValueError(f"GPU instance profile {raw['profileId']}")
        gi = GpuInstance(int(raw["id"]), profile, int(raw["start"]))
        for c in raw["computeInstances"]:
            ci_profile = CI_PROFILES[int(c["profileId"])]
            gi.compute_instances[int(c["id"])] = ComputeInstance(
                int(c["id"]), ci_profile, int(c["start"]), str(c["uuid"])
            )
        g.gpu_instances[gi.id] = gi
    if not mig_rules.admissible(g.placed()):
        raise ValueError(f"GPU {g.index}: the saved GPU instances break the MIG rules")
