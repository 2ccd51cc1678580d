"""Flags shared by the node-side commands. Every flag can also come from a DRADRIVER_*
environment variable (the Helm chart sets those), named after the flag."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME


def env_name(flag: str) -> str:
    return "DRADRIVER_" + flag.lstrip("-").replace("-", "_").upper()


def add(
    p: argparse.ArgumentParser, flag: str, default: Any = None, *, help: str = "", **kw: Any
) -> None:
    env = env_name(flag)
    value = os.environ.get(env, default)
    shown = f" (env {env}; default: %(default)s)" if default is not None else f" (env {env})"
    p.add_argument(flag, default=value, help=help + shown, **kw)


def add_node_flags(p: argparse.ArgumentParser) -> None:
    add(
        p,
        "--node-name",
        os.environ.get("NODE_NAME") or socket.gethostname(),
        help="the Kubernetes node this runs on; names the pool and the slices",
    )
    add(p, "--driver-name", DEFAULT_DRIVER_NAME, help="DRA driver name, also the attribute domain")
    add(
        p,
        "--devices",
        "nvml",
        help="device backend: `nvml` for this node's GPUs, or `fake:<spec>` such as "
        "fake:8xH100-80GB, fake:4xA100-80GB:nvlink=pairs+2xL4 or fake:@fleet.yaml",
    )
    add(
        p,
        "--mig-mode",
        "none",
        help="MIG devices to publish: none (whole GPUs), static "
        "(existing MIG devices) or dynamic (every profile x placement, carved on demand; "
        "needs the DRAPartitionableDevices gate)",
        choices=["none", "static", "dynamic"],
    )
    add(
        p,
        "--mig-mode-switching",
        "on-demand",
        help="dynamic MIG mode: whether the driver may switch a GPU's MIG mode (on for a "
        "partition, off for a whole GPU, switched back after): on-demand, or never where "
        "the admin sets MIG mode (e.g. DCGM holds the GPUs)",
        choices=["on-demand", "never"],
    )
    add(
        p,
        "--mig-profiles",
        "",
        help="dynamic MIG mode: offer partitions of these GPU-instance profiles only, "
        "comma-separated as NVML names them (e.g. 1g.10gb,3g.40gb); empty: every profile. "
        "Fewer profiles publish fewer devices, which the API server and scheduler hold",
    )
    add(
        p,
        "--consumable-capacity",
        "off",
        help="let several claims share a device, each consuming part of it (the "
        "DRAConsumableCapacity gate): off (one claim per device), memory (a claim takes "
        "the memory and multiprocessors it asks for; all the memory when it asks for "
        "nothing), shares=N (N shares, one per claim by default), unlimited (any number "
        "of claims); whole GPUs and, in static MIG mode, existing MIG devices",
    )
    add(
        p,
        "--state-dir",
        "/var/lib/dradriver",
        help="where the plugin keeps its checkpoint (and the fake backend its MIG state)",
    )


def mig_profiles(value: str) -> frozenset[str]:
    """--mig-profiles as a set of names (empty: all)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())
