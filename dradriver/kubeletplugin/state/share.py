"""A share's record: one allocation of a device several claims share (consumable
capacity), as the checkpoint keeps it under a prepared device's "share"."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    def cdi_name(self) -> str:
        return f"share-{self.share_id}"

    @property
    def namespace(self) -> str:
        """Its MPS v3 namespace: lowercase letters, digits and "_", at most 64."""
        return "s_" + "".join(c if c.isalnum() else "_" for c in self.share_id.lower())[:60]
