"""An IMEX channel's record: which ComputeDomain it serves, and the node's IMEX daemon
started for it (hardware/imex.py: a pod of its own), as the checkpoint keeps it under a
prepared device's "imex". A channel device is allocated once per node, so one claim a node holds a
domain's channel, and the daemon is that claim's: started at its prepare, stopped at
its unprepare."""

from __future__ import annotations

from dataclasses import dataclass, field

from dradriver.kubeletplugin.state.daemon import DaemonRef


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
