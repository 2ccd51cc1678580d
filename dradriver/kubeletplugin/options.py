"""The kubelet plugin's flags, apart from its code: building the CLI parser must not
import what the plugin runs (its registration socket is up before that is loaded)."""

from __future__ import annotations

import argparse
import os

from dradriver import flags


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
        "--driver-files",
        "cdi",
        "how a container gets the NVIDIA driver's libraries and commands: cdi (a node-wide "
        "CDI spec of them, as NVIDIA's container toolkit computes them from --driver-root, "
        "which each GPU device names: any runtime with CDI, no NVIDIA runtime needed) or "
        "runtime (only device nodes and NVIDIA_VISIBLE_DEVICES, for NVIDIA's legacy "
        "runtime to add the driver)",
        choices=["cdi", "runtime"],
    )
    flags.add(
        p,
        "--driver-root",
        "/",
        "where the NVIDIA driver's files are, as this process sees them "
        "(the chart mounts the host's at /driver-root)",
    )
    flags.add(
        p,
        "--host-driver-root",
        "",
        "the same as the host and its container runtime see it: / for a driver installed "
        "on the host, /run/nvidia/driver for the GPU Operator's (default: --driver-root)",
    )
    flags.add(
        p,
        "--cdi-hook-path",
        "",
        "the host's nvidia-cdi-hook, which the runtime runs for the driver spec's hooks (ld "
        "cache, symlinks), e.g. /usr/bin/nvidia-cdi-hook (NVIDIA's toolkit packages) or "
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook (the GPU Operator's); empty: the one "
        "this driver carries, copied to <kubelet-dir>/plugins/<driver-name>/",
    )
    flags.add(
        p,
        "--instance",
        os.environ.get("POD_UID") or os.urandom(4).hex(),
        "unique name of this instance in socket names (rolling updates run two)",
    )
    flags.add(
        p,
        "--owner-daemonset",
        "",
        "NAMESPACE/NAME of the DaemonSet running this plugin (the chart sets it): when it "
        "is deleted (an uninstall), the plugin removes its state at stop if nothing is "
        "left to undo; empty: the state is always kept",
    )
    flags.add(
        p,
        "--cgroup-root",
        "/sys/fs/cgroup",
        "the host's cgroup v2 mount, where the kubelet's pod cgroups are: with consumable "
        "capacity each share's memory is also set as its pods' GPU-memory limit there "
        "(r615+ drivers, whole GPUs)",
    )
    flags.add(
        p,
        "--imex-channels",
        "off",
        "publish an IMEX channel device where the node's GPUs are in one "
        "multi-node NVLink fabric clique, and prepare them for ComputeDomains with an "
        "IMEX daemon (nvidia-imex) per domain: on or off",
        choices=["on", "off"],
    )
    flags.add(
        p,
        "--imex-binding-conditions",
        "auto",
        "hold a ComputeDomain pod's binding until this node's IMEX daemon is ready, with "
        "device binding conditions (DRADeviceBindingConditions and "
        "DRAResourceClaimDeviceStatus on the API server and the scheduler: alpha gates on "
        "1.34 and 1.35, on by default from 1.36): auto (where the API server keeps them), "
        "on, or off (prepare waits instead)",
        choices=["auto", "on", "off"],
    )
    flags.add(p, "--imex-port", "50000", "SERVER_PORT of the IMEX daemons (every node's)", type=int)
    flags.add(
        p,
        "--imex-cmd-port",
        "50005",
        "IMEX_CMD_PORT of the IMEX daemons: their command service, for nvidia-imex-ctl",
        type=int,
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
    flags.add(
        p,
        "--health-skip-xids",
        "13,31,43,45,68,109",
        "XIDs that signal an application's fault, not the device's: they taint nothing "
        "(comma-separated; empty: every XID taints)",
    )
    flags.add(
        p,
        "--health-taint-effect",
        "NoSchedule",
        "effect of the taint on an unhealthy device: NoSchedule keeps new claims off it; "
        "NoExecute also has kube-controller-manager evict the pods using it (both need "
        "the DRADeviceTaints gate)",
        choices=["NoSchedule", "NoExecute"],
    )
    flags.add(
        p,
        "--health-probe-period",
        "5",
        "seconds between health probes of each GPU (on the bus, no pending row remapping)",
        type=float,
    )
    flags.add(
        p,
        "--health-recovery-probes",
        "3",
        "clean probes in a row after which an unhealthy GPU is healthy again",
        type=int,
    )
    flags.add(p, "--log-level", "info", "debug, info, warning or error")
