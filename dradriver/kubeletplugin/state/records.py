"""Typed records of what this node prepared: per claim, per device, with the MIG
partition carved for it, the existing MIG device it names, the sharing set up for it and
its GPU's minor number. The planner (prepare/plan.py) makes them; they are frozen, so
each step of the executor (prepare/execute.py) returns a new one as its work leaves it
(`with_device`), and the checkpoint keeps them (checkpoint/) without copying.

Every record converts to and from JSON through the one converter (files.py); keys a
release does not know are carried through unchanged (docs/design.md, "The checkpoint's format").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
STATES: Final = (PREPARE_STARTED, PREPARE_COMPLETED)
CURRENT_VERSION: Final = 1


# -- the parts of a prepared device -------------------------------------------------------------


@dataclass(frozen=True)
class Carve:
    """The MIG partition a device is carved as: the intent (GPU, profile, placement) is
    recorded before carving, the created instance ids right after."""

    gpu_uuid: str = field(metadata={"key": "gpuUUID"})
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


@dataclass(frozen=True)
class MigIds:
    """The GPU and compute instance of an existing MIG device (static mode)."""

    gpu_instance_id: int
    compute_instance_id: int


# -- devices, claims, the checkpoint ----------------------------------------------------------


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
    # Keys a newer release wrote; written back unchanged so a downgrade followed by an
    # upgrade does not lose them.
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def cdi_name(self) -> str:
        """The device's name in the claim's CDI spec: each share is a CDI device."""
        return self.device if self.share is None else f"{self.device}-share-{self.share.share_id}"

    def mig_ids(self) -> tuple[int, int] | None:
        """(GPU instance, compute instance) of the MIG device, once it exists."""
        if self.carve is not None and self.carve.gpu_instance_id is not None:
            assert self.carve.compute_instance_id is not None
            return self.carve.gpu_instance_id, self.carve.compute_instance_id
        if self.mig is not None:
            return self.mig.gpu_instance_id, self.mig.compute_instance_id
        return None


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str  # PREPARE_STARTED or PREPARE_COMPLETED
    devices: list[PreparedDevice] = field(default_factory=list)
    updated_at: float = 0.0  # epoch seconds
    # Keys a newer release wrote, as it wrote them.
    unknown: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def with_device(self, i: int, d: PreparedDevice) -> ClaimRecord:
        """This record with its `i`th device replaced by `d`."""
        return dataclasses.replace(self, devices=[*self.devices[:i], d, *self.devices[i + 1 :]])


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


@dataclass(frozen=True)
class DaemonRef:
    """A daemon pod: its name (stable for what it serves, so a retry or a later plugin
    finds it) and its UID ("" where only the name is known)."""

    name: str
    uid: str = field(default="", metadata={"always": True})


@dataclass(frozen=True)
class Share:
    """One allocation of a device several claims share (consumable capacity): the
    scheduler's shareID and consumedCapacity, and the limits they come to on this node
    (prepare/shares.py); None where the share has no limit of its own."""

    share_id: str = field(metadata={"key": "shareID"})
    consumed: tuple[tuple[str, str], ...] = ()  # capacity name -> quantity, as allocated
    memory_limit: int | None = None  # bytes
    compute_limit: int | None = None  # percent of the device's SMs
    # Under the device's MPS daemon (hardware/shares.py): the pipe directory its clients
    # use (with MPS v3 the share's own namespace in it), the daemon's log and /dev/shm
    # directories, and whether the share's limits are set there.
    pipe_dir: str | None = None
    log_dir: str | None = None
    shm_dir: str | None = None
    applied: bool = False
    # Set on the server side (MPS v3 namespace); False: only in the client's environment.
    server_side: bool = False
    # The pods (UIDs) the claim was reserved for at prepare, and the pod cgroups whose
    # GPU-memory limit on the device holds this share's memory (hardware/pod_memory.py).
    pods: tuple[str, ...] = ()
    pod_cgroups: tuple[str, ...] = ()

    @property
    def namespace(self) -> str:
        """Its MPS v3 namespace: lowercase letters, digits and "_", at most 64."""
        return "s_" + "".join(c if c.isalnum() else "_" for c in self.share_id.lower())[:60]


@dataclass(frozen=True)
class TimeSlicing:
    TAG: ClassVar[str] = "TimeSlicing"
    interval: str  # Default, Short, Medium, Long
    applied: bool = False


@dataclass(frozen=True)
class MpsLimits:
    active_thread_percentage: int | None = None
    pinned_memory_limit: str | None = None  # a Kubernetes quantity, for every device
    # (UUID or index, quantity)
    per_device_pinned: tuple[tuple[str, str], ...] = field(
        default=(), metadata={"key": "perDevicePinnedMemoryLimit"}
    )


@dataclass(frozen=True)
class Mps:
    """An MPS control daemon shared by the claim's devices of one limits group (its pod:
    kubeletplugin/daemons/): the directories the claim's containers mount. The compute
    mode it changed is the ledger's (state/ledger.py), written before the change."""

    TAG: ClassVar[str] = "MPS"
    limits: MpsLimits = field(metadata={"always": True})
    applied: bool = False
    pipe_dir: str | None = None
    log_dir: str | None = None
    shm_dir: str | None = None  # the daemon's and its clients' /dev/shm
    daemon: DaemonRef | None = None

    @property
    def group(self) -> str:
        """Devices of one claim with the same limits share one daemon."""
        return json.dumps(dataclasses.asdict(self.limits), sort_keys=True)


Sharing = TimeSlicing | Mps


@dataclass(frozen=True)
class ImexDaemon:
    domain_uid: str = field(metadata={"key": "domainUID"})
    domain: str  # the ComputeDomain's name, in the claim's namespace
    namespace: str
    channel: int
    # Known once the domain lists its nodes: this node's IMEX address and every node's
    # (this one's included), as written into the daemon's nodes config.
    address: str = ""
    peers: tuple[str, ...] = ()
    config_dir: str | None = None  # recorded before the daemon starts
    daemon: DaemonRef | None = None  # its pod (kubeletplugin/daemons/)


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it: the only three strings a prepare call carries."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
