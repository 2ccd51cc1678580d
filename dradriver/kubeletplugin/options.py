"""The kubelet plugin's flags, apart from its code: building the CLI parser must not
import what the plugin runs (its registration socket is up before that is loaded)."""

from __future__ import annotations

import argparse
import os

from dradriver.commands import flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_node_flags(p)
    flags.add(
        p,
        "--kubeconfig",
        os.environ.get("KUBECONFIG"),
        "kubeconfig (default: the in-cluster config)",
    )
    flags.add(
        p,
        "--kubelet-dir",
        "/var/lib/kubelet",
        "kubelet root; sockets go to plugins_registry/ and plugins/<driver>/",
    )
    flags.add(p, "--cdi-dir", "/var/run/cdi", "where per-claim CDI specs are written")
    flags.add(
        p,
        "--instance",
        os.environ.get("POD_UID") or os.urandom(4).hex(),
        "unique name of this instance in socket names (rolling updates run two)",
    )
    flags.add(p, "--healthz-address", "0.0.0.0", "address of /healthz, /readyz, /metrics")
    flags.add(p, "--healthz-port", "8081", "port of /healthz, /readyz, /metrics (0: any)", type=int)
    flags.add(
        p,
        "--rediscover-period",
        "300",
        "seconds between device rediscoveries (also on SIGHUP)",
        type=float,
    )
    flags.add(
        p,
        "--claim-status",
        "on",
        "write each prepared claim's status.devices (UUID, CDI IDs) once, in the background: "
        "on or off (off: no API write at all in the prepare and unprepare path)",
        choices=["on", "off"],
    )
    flags.add(p, "--log-level", "info", "debug, info, warning or error")
