"""Typed records of what this node prepared: per claim, per device, with the MIG
partition carved for it, the existing MIG device it names, the sharing set up for it and
its GPU's minor number. The planner (prepare/plan.py) makes them; they are frozen, so
each step of the executor (prepare/execute.py) returns a new one as its work leaves it
(`with_device`), and the checkpoint keeps them (checkpoint/) without copying.

Each record converts to and from its JSON form explicitly. The JSON layout is the one
checkpoint version 1 has always had (typed parts under a device's "extra"), so a file
written here is read fully by every release since version 1; keys a release does not
know are carried through unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

# The decoding helpers are re-exported: the checkpoint's codec reads with them too.
from dradriver.kubeletplugin.state.decode import CheckpointCorrupt as CheckpointCorrupt
from dradriver.kubeletplugin.state.decode import get as get
from dradriver.kubeletplugin.state.decode import obj as _object
from dradriver.kubeletplugin.state.decode import optional as optional
from dradriver.kubeletplugin.state.decode import str_list as str_list
from dradriver.kubeletplugin.state.decode import unknown as unknown
from dradriver.kubeletplugin.state.imex import ImexDaemon as ImexDaemon
from dradriver.kubeletplugin.state.share import Share as Share
from dradriver.kubeletplugin.state.sharing import Mps as Mps
from dradriver.kubeletplugin.state.sharing import MpsLimits as MpsLimits
from dradriver.kubeletplugin.state.sharing import Sharing as Sharing
from dradriver.kubeletplugin.state.sharing import TimeSlicing as TimeSlicing
from dradriver.kubeletplugin.state.sharing import sharing_from_json as sharing_from_json

PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
STATES: Final = (PREPARE_STARTED, PREPARE_COMPLETED)
CURRENT_VERSION: Final = 1


@dataclass(frozen=True)
class Unread:
    """JSON a newer release wrote where this one knows no key: written back as it was
    read, never looked into (nothing of this release may put anything here)."""

    fields: dict[str, Any] = field(default_factory=dict)


# -- the parts of a prepared device -------------------------------------------------------------


@dataclass(frozen=True)
class Carve:
    """The MIG partition a device is carved as: the intent (GPU, profile, placement) is
    recorded before carving, the created instance ids right after."""

    gpu_uuid: str
    profile_id: int
    profile: str
    placement_start: int
    placement_size: int
    compute_slices: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def created(self) -> bool:
        return self.gpu_instance_id is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuUUID": self.gpu_uuid,
            "profileId": self.profile_id,
            "profile": self.profile,
            "placementStart": self.placement_start,
            "placementSize": self.placement_size,
            "computeSlices": self.compute_slices,
            "gpuInstanceId": self.gpu_instance_id,
            "computeInstanceId": self.compute_instance_id,
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> Carve:
        c = _object(value, where)
        return cls(
            gpu_uuid=get(c, "gpuUUID", str, where=where),
            profile_id=get(c, "profileId", int, where=where),
            profile=optional(c, "profile", str, default="", where=where),
            placement_start=get(c, "placementStart", int, where=where),
            placement_size=get(c, "placementSize", int, where=where),
            compute_slices=get(c, "computeSlices", int, where=where),
            gpu_instance_id=optional(c, "gpuInstanceId", int, default=None, where=where),
            compute_instance_id=optional(c, "computeInstanceId", int, default=None, where=where),
        )


@dataclass(frozen=True)
class MigIds:
    """The GPU and compute instance of an existing MIG device (static mode)."""

    gpu_instance_id: int
    compute_instance_id: int

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuInstanceId": self.gpu_instance_id,
            "computeInstanceId": self.compute_instance_id,
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> MigIds:
        m = _object(value, where)
        return cls(
            get(m, "gpuInstanceId", int, where=where), get(m, "computeInstanceId", int, where=where)
        )


# -- devices, claims, the checkpoint ----------------------------------------------------------

_DEVICE_KEYS = ("requestNames", "pool", "device", "cdiDeviceIds", "uuid", "kind", "extra")
_EXTRA_KEYS = ("minor", "carve", "mig", "sharing", "adminAccess", "share", "imex")
_CLAIM_KEYS = (
    "uid", "namespace", "name", "state", "devices", "updatedAt", "extra", "minReader",
)  # fmt: skip


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet, plus what unprepare and
    a rewrite of the CDI spec need to know about it."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]
    uuid: str | None = None  # a partition's MIG UUID is known once carved
    kind: str = "gpu"  # "gpu" | "mig" | "imex-channel"
    minor: int | None = None  # of the (parent) GPU: /dev/nvidia<minor>
    carve: Carve | None = None  # a partition carved at prepare
    mig: MigIds | None = None  # an existing MIG device
    sharing: Sharing | None = None
    # Given by adminAccess (monitoring, diagnostics): beside whatever claim holds the
    # device, with nothing carved, switched or shared for it.
    admin_access: bool = False
    # One share of a device that allows multiple allocations; None: the whole device.
    share: Share | None = None
    # An IMEX channel of a ComputeDomain, and the node's IMEX daemon for it.
    imex: ImexDaemon | None = None
    # Keys of "extra" and of the device written by a newer release; written back
    # unchanged so a downgrade followed by an upgrade does not lose them.
    extra_unknown: dict[str, Any] = field(default_factory=dict, repr=False)
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        """What tells a claim's devices apart: the device, and its share."""
        return self.device, self.share.share_id if self.share is not None else ""

    @property
    def cdi_name(self) -> str:
        """The device's name in the claim's CDI spec: each share is a CDI device."""
        return self.device if self.share is None else f"{self.device}-{self.share.cdi_name}"

    def mig_ids(self) -> tuple[int, int] | None:
        """(GPU instance, compute instance) of the MIG device, once it exists."""
        if self.carve is not None and self.carve.gpu_instance_id is not None:
            assert self.carve.compute_instance_id is not None
            return self.carve.gpu_instance_id, self.carve.compute_instance_id
        if self.mig is not None:
            return self.mig.gpu_instance_id, self.mig.compute_instance_id
        return None

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = dict(self.extra_unknown)
        if self.minor is not None:
            extra["minor"] = self.minor
        if self.carve is not None:
            extra["carve"] = self.carve.to_json()
        if self.mig is not None:
            extra["mig"] = self.mig.to_json()
        if self.sharing is not None:
            extra["sharing"] = self.sharing.to_json()
        if self.admin_access:
            extra["adminAccess"] = True
        if self.share is not None:
            extra["share"] = self.share.to_json()
        if self.imex is not None:
            extra["imex"] = self.imex.to_json()
        return {
            **self.unknown,
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIds": list(self.cdi_device_ids),
            "uuid": self.uuid,
            "kind": self.kind,
            "extra": extra,
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> PreparedDevice:
        obj = _object(value, where)
        extra = dict(optional(obj, "extra", dict, default={}, where=where))
        ew = f"{where}.extra"
        return cls(
            request_names=str_list(obj, "requestNames", where),
            pool=get(obj, "pool", str, where=where),
            device=get(obj, "device", str, where=where),
            cdi_device_ids=str_list(obj, "cdiDeviceIds", where),
            uuid=optional(obj, "uuid", str, default=None, where=where),
            kind=optional(obj, "kind", str, default="gpu", where=where),
            minor=optional(extra, "minor", int, default=None, where=ew),
            carve=Carve.from_json(extra["carve"], f"{ew}.carve") if extra.get("carve") else None,
            mig=MigIds.from_json(extra["mig"], f"{ew}.mig") if extra.get("mig") else None,
            sharing=sharing_from_json(extra["sharing"], f"{ew}.sharing")
            if extra.get("sharing")
            else None,
            admin_access=optional(extra, "adminAccess", bool, default=False, where=ew),
            share=Share.from_json(extra["share"], f"{ew}.share") if extra.get("share") else None,
            imex=ImexDaemon.from_json(extra["imex"], f"{ew}.imex") if extra.get("imex") else None,
            extra_unknown=unknown(extra, _EXTRA_KEYS),
            unknown=unknown(obj, _DEVICE_KEYS),
        )


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str  # PREPARE_STARTED or PREPARE_COMPLETED
    devices: list[PreparedDevice] = field(default_factory=list)
    updated_at: float = 0.0  # epoch seconds
    # The claim's "extra" (this release defines no key in it) and its other keys, as a
    # newer release wrote them.
    extra_unknown: Unread = field(default_factory=Unread, repr=False)
    unknown: Unread = field(default_factory=Unread, repr=False)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def with_device(self, i: int, d: PreparedDevice) -> ClaimRecord:
        """This record with its `i`th device replaced by `d`."""
        devices = list(self.devices)
        devices[i] = d
        return dataclasses.replace(self, devices=devices)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.unknown.fields,
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [d.to_json() for d in self.devices],
            "updatedAt": self.updated_at,
            "extra": self.extra_unknown.fields,
        }

    @classmethod
    def from_json(cls, key: str, value: Any, newer: bool, *, notes: list[str]) -> ClaimRecord:
        where = f"claims[{key!r}]"
        obj = _object(value, where)
        uid = get(obj, "uid", str, where=where)
        if uid != key:
            raise CheckpointCorrupt(f"{where}: stored under another UID than its own ({uid!r})")
        state = get(obj, "state", str, where=where)
        if state not in STATES:
            if not newer:
                raise CheckpointCorrupt(f"{where}.state: unknown state {state!r}")
            # A state from a newer release says nothing this release can rely on: like an
            # unfinished prepare, the caller has to undo or redo it.
            notes.append(
                f"claim {uid}: unknown state {state!r} from a newer release, "
                f"treated as {PREPARE_STARTED}"
            )
            state = PREPARE_STARTED
        devices = get(obj, "devices", list, where=where)
        return cls(
            uid=uid,
            namespace=get(obj, "namespace", str, where=where),
            name=get(obj, "name", str, where=where),
            state=state,
            devices=[
                PreparedDevice.from_json(d, f"{where}.devices[{i}]") for i, d in enumerate(devices)
            ],
            updated_at=float(get(obj, "updatedAt", (int, float), where=where)),
            extra_unknown=Unread(dict(optional(obj, "extra", dict, default={}, where=where))),
            unknown=Unread(unknown(obj, _CLAIM_KEYS)),
        )


@dataclass
class Checkpoint:
    # The format the data was read in (CURRENT_VERSION for a new or saved checkpoint).
    version: int = CURRENT_VERSION
    boot_id: str = ""  # the boot during which the file was last written
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)
    # The boot ID of the system that loaded this checkpoint; set by CheckpointStore.load,
    # never stored. It lets reconcile_boot(cp) stay a pure function of its argument.
    running_boot_id: str | None = field(default=None, compare=False, repr=False)
    # The oldest checkpoint format whose readers can read the file, as it says (codec.py):
    # above CURRENT_VERSION, this release cannot, and must touch nothing it records.
    min_reader: int = field(default=1, compare=False, repr=False)
    # Claims a newer release recorded in a form this release cannot read (their own
    # "minReader" above CURRENT_VERSION): their JSON, by UID, written back as it was
    # read; neither prepared, unprepared nor undone here.
    unreadable: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def readable(self) -> bool:
        return self.min_reader <= CURRENT_VERSION


def owned_partitions(cp: Checkpoint) -> set[tuple[str, int, int]]:
    """(GPU UUID, profile ID, placement) of every partition our claims hold or intend."""
    return {
        (d.carve.gpu_uuid, d.carve.profile_id, d.carve.placement_start)
        for rec in cp.claims.values()
        for d in rec.devices
        if d.carve is not None
    }
