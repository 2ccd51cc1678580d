"""The `dev` part of the dradriver CLI (dradriver/cli.py adds it when this package is
installed): `dradriver dev cluster up|down`, `dradriver dev kubelet` and
`dradriver dev inject`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cluster(args: argparse.Namespace) -> int:
    from dradriver.k8s.lines import LineError, line
    from dradriver_dev import addons, cluster

    state_dir = Path(args.state_dir)
    if args.action == "up":
        before = None if args.replace else cluster.running(state_dir)
        try:
            k8s = line(args.kubernetes) if args.kubernetes else None
            st = cluster.up(
                state_dir, alpha=args.alpha, replace=args.replace, webhook=args.webhook, k8s=k8s
            )
        except (cluster.ClusterError, LineError) as exc:
            print(f"dev cluster: {exc}", file=sys.stderr)
            return 1
        turned_on = cluster.alpha_gates(line(st.k8s)) if st.alpha else ()
        gates = f"Kubernetes {st.k8s}, " + (
            f"gates {', '.join(turned_on)} on" if turned_on else "the line's default gates"
        )
        if before is not None and before.server == st.server:
            print(
                f"dev cluster: already running at {st.server} ({gates}); kept as it is "
                "(--replace, or make cluster-up REPLACE=1, starts a new one)"
            )
        else:
            print(f"dev cluster: up at {st.server} ({gates})")
        classes = ", ".join(d["metadata"]["name"] for d in addons.device_classes())
        print(f"dev cluster: DeviceClasses {classes} applied")
        print(f"dev cluster: CRDs {', '.join(addons.crd_names())} applied")
        if addons.WEBHOOK_PROCESS in st.pids:
            print(
                f"dev cluster: admission webhook (dradriver controller) at "
                f"https://127.0.0.1:{st.ports['webhook']}/validate, readyz "
                f"http://127.0.0.1:{st.ports['webhook-healthz']}/readyz, log "
                f"{state_dir / 'logs' / addons.WEBHOOK_PROCESS}.log"
            )
            print(
                "dev cluster: the same process reconciles ComputeDomains (its Lease: "
                "default/dradriver-controller)"
            )
        print(f"dev cluster: export KUBECONFIG={st.kubeconfig}")
        print(
            f"dev cluster: kubectl {state_dir / 'kubectl'} --kubeconfig {st.kubeconfig} get nodes"
        )
        return 0
    stopped = cluster.down(state_dir)
    print("dev cluster: stopped and removed" if stopped else "dev cluster: nothing was running")
    return 0


def _kubelet(args: argparse.Namespace) -> int:
    from dradriver_dev.hollow_node import run

    return run(args)


def _inject(args: argparse.Namespace) -> int:
    from fakenvml import inject

    state_dir = Path(args.state_dir)
    node = args.node
    if node is None:
        nodes = inject.nodes_in(state_dir)
        if len(nodes) != 1:
            found = ", ".join(nodes) if nodes else "none"
            print(
                f"dev inject: {state_dir} holds fake GPUs of {len(nodes)} nodes ({found}): "
                "name one with --node, or give the plugin's --state-dir",
                file=sys.stderr,
            )
            return 2
        (node,) = nodes
    if args.driver_version is not None:
        req = inject.Request(0, "driver", driver_version=args.driver_version)
    elif args.gpu is None:
        print("dev inject: --gpu INDEX is needed for a GPU's fault", file=sys.stderr)
        return 2
    elif args.xid is not None:
        req = inject.Request(args.gpu, "xid", args.xid, args.gpu_instance)
    else:
        req = inject.Request(args.gpu, "lost" if args.lost else "recover")
    try:
        detail = inject.send(state_dir, node, req, timeout=args.timeout)
    except inject.InjectError as exc:
        print(f"dev inject: {exc}", file=sys.stderr)
        return 1
    print(f"dev inject: node {node}: {detail}")
    return 0


def add_subcommands(dev: argparse.ArgumentParser) -> None:
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")

    cl = dev_sub.add_parser(
        "cluster",
        help="start or stop the local Kubernetes control plane",
        description="Starts (up) or stops (down) etcd, kube-apiserver, kube-scheduler and "
        "kube-controller-manager of a Kubernetes line (1.34 to 1.37) on loopback ports, "
        "built from their Go modules on first use (needs Go). `up` also applies the "
        "driver's DeviceClasses (deploy/deviceclasses.yaml) and, with --webhook, runs the "
        "admission webhook; "
        "`down` stops every process `up` (or `KEEP=1 make demo`) started there.",
    )
    cl.add_argument(
        "action",
        choices=["up", "down"],
        help="up: start (a running cluster is kept, its DeviceClasses applied again); "
        "down: stop everything and remove the state directory",
    )
    cl.add_argument(
        "--replace",
        action="store_true",
        help="up: stop a cluster already in the state directory and start a new one",
    )
    cl.add_argument(
        "--state-dir",
        default=".devcluster",
        help="where the cluster keeps its data, logs and kubeconfig (default: %(default)s)",
    )
    cl.add_argument(
        "--alpha",
        action="store_true",
        help="turn on the gates of the driver's DRA features that the line has off by "
        "default (all six on 1.34 and 1.35, none from 1.36) and resource.k8s.io/v1alpha3",
    )
    cl.add_argument(
        "--kubernetes",
        default=None,
        metavar="LINE",
        help="up: the Kubernetes line, 1.34 to 1.37 (default: $K8S, else 1.34)",
    )
    cl.add_argument(
        "--webhook",
        action="store_true",
        help="up: also run the admission webhook (`dradriver controller`) on loopback with "
        "the chart's webhook configuration, so claims with a bad config for the driver are "
        "refused at apply time; `down` stops it",
    )
    cl.set_defaults(func=_cluster)

    from dradriver_dev.hollow_node import add_arguments

    kl = dev_sub.add_parser(
        "kubelet",
        help="run one hollow GPU node: the kubelet's own code, a CRI that resolves CDI",
        description="Runs the kubelet's own code (k8s.io/kubernetes of the line --kubernetes "
        "or $K8S names) as a node without containers: kubemark's hollow kubelet with the real DRA "
        "manager, and a CRI runtime that resolves each container's CDI devices against the "
        "node's CDI directories as containerd does, recording what each container got under "
        "<root>/cri/pods/. Built from tools/controlplane on first use (needs Go).",
    )
    add_arguments(kl)
    kl.set_defaults(func=_kubelet)

    inj = dev_sub.add_parser(
        "inject",
        help="inject a GPU fault into a running plugin's fake GPUs (XID, lost GPU, reset), "
        "or upgrade its driver",
        description="Acts on the fake GPUs of the kubelet plugin that runs with "
        "--devices fake:... and this --state-dir, while it runs: the plugin sees the "
        "fault through NVML as it would see the real one (XID 79 and --lost: the GPU "
        "falls off the bus; XID 48: also a double-bit ECC event; 48, 94, 95: a row "
        "remapping pending), and --recover resets the GPU. Waits for the plugin's answer.",
    )
    inj.add_argument("--state-dir", required=True, help="the plugin's --state-dir")
    inj.add_argument("--gpu", type=int, metavar="INDEX", help="the GPU's index (for a fault)")
    what = inj.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, metavar="N", help="raise XID N on the GPU")
    what.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    what.add_argument(
        "--recover", action="store_true", help="reset the GPU: back on the bus, faults cleared"
    )
    what.add_argument(
        "--driver-version",
        metavar="X.Y.Z",
        help="the node's driver upgraded: NVML reports this version from now (lay its "
        "files out with `python -m fakenvml.driver_root`)",
    )
    inj.add_argument(
        "--gpu-instance",
        type=int,
        metavar="ID",
        help="with --xid: the GPU instance NVML ties the XID to (MIG)",
    )
    inj.add_argument(
        "--node",
        help="the fake node, when the state directory holds several (default: its only one)",
    )
    inj.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="seconds to wait for the plugin to pick the fault up (default: %(default)s)",
    )
    inj.set_defaults(func=_inject)
