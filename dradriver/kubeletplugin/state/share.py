"""A share's record: one allocation of a device several claims share (consumable
capacity), as the checkpoint keeps it under a prepared device's "share"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.kubeletplugin.state.decode import CheckpointCorrupt, get, obj, optional


@dataclass(frozen=True)
class Share:
    """One allocation of a device several claims share (consumable capacity): the
    scheduler's shareID and consumedCapacity, and the limits they come to on this node
    (prepare/shares.py); None where the share has no limit of its own."""

    share_id: str
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
    def cdi_name(self) -> str:
        return f"share-{self.share_id}"

    @property
    def namespace(self) -> str:
        """Its MPS v3 namespace: lowercase letters, digits and "_", at most 64."""
        return "s_" + "".join(c if c.isalnum() else "_" for c in self.share_id.lower())[:60]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shareID": self.share_id, "consumed": dict(self.consumed)}
        if self.memory_limit is not None:
            out["memoryLimit"] = self.memory_limit
        if self.compute_limit is not None:
            out["computeLimit"] = self.compute_limit
        for key, value in (
            ("pipeDir", self.pipe_dir),
            ("logDir", self.log_dir),
            ("shmDir", self.shm_dir),
        ):
            if value is not None:
                out[key] = value
        if self.applied:
            out["applied"] = True
        if self.server_side:
            out["serverSide"] = True
        if self.pods:
            out["pods"] = list(self.pods)
        if self.pod_cgroups:
            out["podCgroups"] = list(self.pod_cgroups)
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> Share:
        s = obj(value, where)
        consumed = optional(s, "consumed", dict, default={}, where=where)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in consumed.items()):
            raise CheckpointCorrupt(f"{where}.consumed: expected strings")
        return cls(
            get(s, "shareID", str, where=where),
            tuple(sorted(consumed.items())),
            optional(s, "memoryLimit", int, default=None, where=where),
            optional(s, "computeLimit", int, default=None, where=where),
            optional(s, "pipeDir", str, default=None, where=where),
            optional(s, "logDir", str, default=None, where=where),
            optional(s, "shmDir", str, default=None, where=where),
            optional(s, "applied", bool, default=False, where=where),
            optional(s, "serverSide", bool, default=False, where=where),
            _strings(s, "pods", where),
            _strings(s, "podCgroups", where),
        )


def _strings(s: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = optional(s, key, list, default=[], where=where)
    if not all(isinstance(v, str) for v in value):
        raise CheckpointCorrupt(f"{where}.{key}: expected strings")
    return tuple(value)
