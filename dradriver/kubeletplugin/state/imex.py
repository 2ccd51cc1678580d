"""An IMEX channel's record: which ComputeDomain it serves, and the node's IMEX daemon
started for it (hardware/imex.py: a pod of its own), as the checkpoint keeps it under a
prepared device's "imex". A channel device is allocated once per node, so one claim a node holds a
domain's channel, and the daemon is that claim's: started at its prepare, stopped at
its unprepare."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dradriver.kubeletplugin.state.daemon import DaemonRef
from dradriver.kubeletplugin.state.decode import CheckpointCorrupt, get, obj, optional


@dataclass(frozen=True)
class ImexDaemon:
    domain_uid: str
    domain: str  # the ComputeDomain's name, in the claim's namespace
    namespace: str
    channel: int
    # Known once the domain lists its nodes: this node's IMEX address and every node's
    # (this one's included), as written into the daemon's nodes config.
    address: str = ""
    peers: tuple[str, ...] = ()
    config_dir: str | None = None  # recorded before the daemon starts
    daemon: DaemonRef | None = None  # its pod (kubeletplugin/daemons/)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "domainUID": self.domain_uid,
            "domain": self.domain,
            "namespace": self.namespace,
            "channel": self.channel,
        }
        if self.address:
            out["address"] = self.address
        if self.peers:
            out["peers"] = list(self.peers)
        if self.config_dir is not None:
            out["configDir"] = self.config_dir
        if self.daemon is not None:
            out["daemon"] = self.daemon.to_json()
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> ImexDaemon:
        d = obj(value, where)
        peers = optional(d, "peers", list, default=[], where=where)
        if not all(isinstance(p, str) for p in peers):
            raise CheckpointCorrupt(f"{where}.peers: expected strings")
        return cls(
            get(d, "domainUID", str, where=where),
            get(d, "domain", str, where=where),
            get(d, "namespace", str, where=where),
            get(d, "channel", int, where=where),
            optional(d, "address", str, default="", where=where),
            tuple(peers),
            optional(d, "configDir", str, default=None, where=where),
            DaemonRef.from_json(d["daemon"], f"{where}.daemon") if d.get("daemon") else None,
        )
