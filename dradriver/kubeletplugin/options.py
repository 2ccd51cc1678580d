"""The kubelet plugin's flags, and the typed options they are parsed into once.
add_arguments builds the CLI parser without importing what the plugin runs (its
registration socket is up before that is loaded): parse() imports the types it checks
the flags against when it is called, after the sockets.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver import flags

if TYPE_CHECKING:
    from dradriver.inventory.node_devices import MigMode, MigSwitching
    from dradriver.kubeletplugin.device_view.health import HealthOptions
    from dradriver.slices.consumable import Consumable


class OptionsError(ValueError):
    """Flags that cannot work: `what` names the flag, `why` says why and the fix."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")
        self.what, self.why = what, why


@dataclass(frozen=True)
class PluginOptions:
    """What `dradriver kubelet-plugin` runs with, each flag parsed and checked once."""

    node_name: str
    driver_name: str
    devices: str  # the backend: "nvml" or "fake:<spec>"
    mig_mode: MigMode
    mig_mode_switching: MigSwitching
    mig_profiles: frozenset[str]  # empty: every profile
    consumable: Consumable
    state_dir: Path
    kubeconfig: str | None  # None: in-cluster, then ~/.kube/config
    kubelet_dir: Path
    cdi_dir: Path
    driver_files: bool  # --driver-files cdi (else runtime: the runtime brings the driver)
    driver_root: Path
    host_driver_root: Path
    cdi_hook_path: str  # empty: the one this driver carries
    instance: str
    owner_daemonset: str  # NAMESPACE/NAME, or empty
    cgroup_root: Path
    imex_channels: bool
    imex_binding_conditions: str  # auto, on or off
    imex_port: int
    imex_cmd_port: int
    nvlink_domain_label: bool
    mps_shm_size: int  # bytes
    mps_v2_shares: bool  # shares of a GPU on drivers before r615, without isolation
    daemon_image: str  # the image of the daemons' pods; empty: none can be started
    daemon_namespace: str
    healthz_address: str
    healthz_port: int
    rediscover_period: float
    claim_status: bool
    health: HealthOptions


def parse(args: argparse.Namespace) -> PluginOptions:
    """The options of `args` (as add_arguments made them); OptionsError names a flag
    that cannot work, alone or with the others."""
    from dradriver.api.config import quantity_bytes
    from dradriver.health.model import Policy, parse_xids
    from dradriver.inventory.node_devices import MigMode, MigSwitching
    from dradriver.kubeletplugin.device_view.health import HealthOptions
    from dradriver.slices.consumable import from_flags
    from dradriver.slices.taints import TaintEffect

    what = "bad --consumable-capacity"  # the flags checked when a ValueError comes
    try:
        consumable = from_flags(args.consumable_capacity, args.mig_mode)
        what = "bad health flags"
        health = HealthOptions(
            Policy(parse_xids(args.health_skip_xids), args.health_recovery_probes),
            TaintEffect(args.health_taint_effect),
            args.health_probe_period,
        )
        what = "bad --mps-shm-size"
        mps_shm_size = quantity_bytes(args.mps_shm_size)
        if mps_shm_size < 1 << 20:
            raise ValueError(f"{args.mps_shm_size} is under 1Mi")
    except ValueError as exc:  # ConsumableModeError and HealthConfigError among them
        raise OptionsError(what, str(exc)) from exc
    return PluginOptions(
        node_name=args.node_name,
        driver_name=args.driver_name,
        devices=args.devices,
        mig_mode=MigMode(args.mig_mode),
        mig_mode_switching=MigSwitching(args.mig_mode_switching),
        mig_profiles=flags.mig_profiles(args.mig_profiles),
        consumable=consumable,
        state_dir=Path(args.state_dir),
        kubeconfig=args.kubeconfig or None,
        kubelet_dir=Path(args.kubelet_dir),
        cdi_dir=Path(args.cdi_dir),
        driver_files=args.driver_files == "cdi",
        driver_root=Path(args.driver_root),
        host_driver_root=Path(args.host_driver_root or args.driver_root),
        cdi_hook_path=args.cdi_hook_path,
        instance=args.instance,
        owner_daemonset=args.owner_daemonset,
        cgroup_root=Path(args.cgroup_root),
        imex_channels=args.imex_channels == "on",
        imex_binding_conditions=args.imex_binding_conditions,
        imex_port=args.imex_port,
        imex_cmd_port=args.imex_cmd_port,
        nvlink_domain_label=args.nvlink_domain_label == "on",
        mps_shm_size=mps_shm_size,
        mps_v2_shares=args.mps_v2_shares == "allow",
        daemon_image=args.daemon_image,
        daemon_namespace=args.daemon_namespace,
        healthz_address=args.healthz_address,
        healthz_port=args.healthz_port,
        rediscover_period=args.rediscover_period,
        claim_status=args.claim_status == "on",
        health=health,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    def add(flag: str, default: str | None, help: str, **kw: Any) -> None:
        flags.add(p, flag, default, help=help, **kw)

    on_off = partial(add, choices=["on", "off"])

    flags.add_node_flags(p)
    add(
        "--kubeconfig",
        os.environ.get("KUBECONFIG"),
        "kubeconfig (default: $KUBECONFIG; with none, the pod's service account in a pod, "
        "else ~/.kube/config)",
    )
    add(
        "--kubelet-dir",
        "/var/lib/kubelet",
        "kubelet root; sockets go to plugins_registry/ and plugins/<driver>/",
    )
    add("--cdi-dir", "/var/run/cdi", "where per-claim CDI specs are written")
    add(
        "--driver-files",
        "cdi",
        "how a container gets the NVIDIA driver's libraries and commands: cdi (a node-wide "
        "CDI spec of them, as NVIDIA's container toolkit computes them from --driver-root, "
        "which each GPU device names: any runtime with CDI, no NVIDIA runtime needed) or "
        "runtime (only device nodes and NVIDIA_VISIBLE_DEVICES, for NVIDIA's legacy "
        "runtime to add the driver)",
        choices=["cdi", "runtime"],
    )
    add(
        "--driver-root",
        "/",
        "where the NVIDIA driver's files are, as this process sees them "
        "(the chart mounts the host's at /driver-root)",
    )
    add(
        "--host-driver-root",
        "",
        "the same as the host and its container runtime see it: / for a driver installed "
        "on the host, /run/nvidia/driver for the GPU Operator's (default: --driver-root)",
    )
    add(
        "--cdi-hook-path",
        "",
        "the host's nvidia-cdi-hook, which the runtime runs for the driver spec's hooks (ld "
        "cache, symlinks), e.g. /usr/bin/nvidia-cdi-hook (NVIDIA's toolkit packages) or "
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook (the GPU Operator's); empty: the one "
        "this driver carries, copied to <kubelet-dir>/plugins/<driver-name>/",
    )
    add(
        "--instance",
        os.environ.get("POD_UID") or os.urandom(4).hex(),
        "unique name of this instance in socket names (rolling updates run two)",
    )
    add(
        "--owner-daemonset",
        "",
        "NAMESPACE/NAME of the DaemonSet running this plugin (the chart sets it): when it "
        "is deleted (an uninstall), the plugin removes its state at stop if nothing is "
        "left to undo; empty: the state is always kept",
    )
    add(
        "--cgroup-root",
        "/sys/fs/cgroup",
        "the host's cgroup v2 mount, where the kubelet's pod cgroups are: with consumable "
        "capacity each share's memory is also set as its pods' GPU-memory limit there "
        "(r615+ drivers, whole GPUs)",
    )
    on_off(
        "--imex-channels",
        "off",
        "publish an IMEX channel device where the node's GPUs are in one "
        "multi-node NVLink fabric clique, and prepare them for ComputeDomains with an "
        "IMEX daemon (nvidia-imex) per domain: on or off",
    )
    add(
        "--imex-binding-conditions",
        "auto",
        "hold a ComputeDomain pod's binding until this node's IMEX daemon is ready, with "
        "device binding conditions (DRADeviceBindingConditions and "
        "DRAResourceClaimDeviceStatus on the API server and the scheduler: alpha gates on "
        "1.34 and 1.35, on by default from 1.36): auto (where the API server keeps them), "
        "on, or off (prepare waits instead)",
        choices=["auto", "on", "off"],
    )
    add("--imex-port", "50000", "SERVER_PORT of the IMEX daemons (every node's)", type=int)
    add(
        "--imex-cmd-port",
        "50005",
        "IMEX_CMD_PORT of the IMEX daemons: their command service, for nvidia-imex-ctl",
        type=int,
    )
    on_off(
        "--nvlink-domain-label",
        "on",
        "label the Node gpu.dradriver.io/nvlink-domain=<clusterUuid>.<cliqueId> where its "
        "GPUs are in a multi-node NVLink fabric clique (a podAffinity topologyKey): on or off "
        "(off: the plugin never writes to its Node, and needs no patch on nodes)",
    )
    add(
        "--mps-shm-size",
        "1Gi",
        "size of the tmpfs each MPS control daemon and its clients get as /dev/shm "
        "(a quantity such as 1Gi; the containers' /dev/shm too, charged to their memory)",
    )
    add(
        "--mps-v2-shares",
        "refuse",
        "with --consumable-capacity on a driver before r615 (MPS v2, no per-share MPS "
        "server): refuse (publish the GPUs whole: every share's container would get the "
        "device daemon's whole pipe directory, so one tenant could stop it or retune the "
        "others) or allow (share all the same, for one tenant's pods)",
        choices=["refuse", "allow"],
    )
    add(
        "--daemon-image",
        "",
        "the image of the pods that run the daemons prepared claims depend on (MPS control "
        "daemons, IMEX daemons), so that they outlive this process (the chart sets its own "
        "image); empty: such claims fail to prepare, saying so",
    )
    add(
        "--daemon-namespace",
        os.environ.get("POD_NAMESPACE") or "default",
        "the namespace of the daemons' pods (default: $POD_NAMESPACE, the chart's; else default)",
    )
    add("--healthz-address", "0.0.0.0", "address of /healthz, /readyz, /metrics")
    add("--healthz-port", "8081", "port of /healthz, /readyz, /metrics (0: any)", type=int)
    add(
        "--rediscover-period",
        "300",
        "seconds between device rediscoveries (also on SIGHUP)",
        type=float,
    )
    on_off(
        "--claim-status",
        "on",
        "write each prepared claim's status.devices (UUID, CDI IDs) once, in the background: "
        "on or off (off: no API write at all in the prepare and unprepare path)",
    )
    add(
        "--health-skip-xids",
        "13,31,43,45,68,109",
        "XIDs that signal an application's fault, not the device's: they taint nothing "
        "(comma-separated; empty: every XID taints)",
    )
    add(
        "--health-taint-effect",
        "NoSchedule",
        "effect of the taint on an unhealthy device: NoSchedule keeps new claims off it; "
        "NoExecute also has kube-controller-manager evict the pods using it (both need "
        "the DRADeviceTaints gate)",
        choices=["NoSchedule", "NoExecute"],
    )
    add(
        "--health-probe-period",
        "5",
        "seconds between health probes of each GPU (on the bus, no pending row remapping)",
        type=float,
    )
    add(
        "--health-recovery-probes",
        "3",
        "clean probes in a row after which an unhealthy GPU is healthy again",
        type=int,
    )
    add("--log-level", "info", "debug, info, warning or error")
