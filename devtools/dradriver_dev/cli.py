"""The `dev` part of the dradriver CLI (dradriver/cli.py adds it when this package is
installed): `dradriver dev cluster up|down` and `dradriver dev kubelet`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cluster(args: argparse.Namespace) -> int:
    from dradriver_dev import addons, cluster

    state_dir = Path(args.state_dir)
    if args.action == "up":
        before = None if args.replace else cluster.running(state_dir)
        try:
            st = cluster.up(state_dir, alpha=args.alpha, replace=args.replace, webhook=args.webhook)
        except cluster.ClusterError as exc:
            print(f"dev cluster: {exc}", file=sys.stderr)
            return 1
        gates = "alpha DRA gates on" if st.alpha else "GA defaults"
        if before is not None and before.server == st.server:
            print(
                f"dev cluster: already running at {st.server} ({gates}); kept as it is "
                "(--replace, or make cluster-up REPLACE=1, starts a new one)"
            )
        else:
            print(f"dev cluster: up at {st.server} ({gates})")
        classes = ", ".join(d["metadata"]["name"] for d in addons.device_classes())
        print(f"dev cluster: DeviceClasses {classes} applied")
        if addons.WEBHOOK_PROCESS in st.pids:
            print(
                f"dev cluster: admission webhook (dradriver controller) at "
                f"https://127.0.0.1:{st.ports['webhook']}/validate, readyz "
                f"http://127.0.0.1:{st.ports['webhook-healthz']}/readyz, log "
                f"{state_dir / 'logs' / addons.WEBHOOK_PROCESS}.log"
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


def add_subcommands(dev: argparse.ArgumentParser) -> None:
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")

    cl = dev_sub.add_parser(
        "cluster",
        help="start or stop the local Kubernetes control plane",
        description="Starts (up) or stops (down) etcd, kube-apiserver, kube-scheduler and "
        "kube-controller-manager of Kubernetes 1.34 on loopback ports, built from their Go "
        "modules on first use (needs Go). `up` also applies the driver's DeviceClasses "
        "(deploy/deviceclasses.yaml) and, with --webhook, runs the admission webhook; "
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
        help="turn on the alpha DRA feature gates and resource.k8s.io/v1alpha3",
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
        help="run one hollow GPU node: the v1.34 kubelet's own code, a CRI that resolves CDI",
        description="Runs the kubelet's own code (k8s.io/kubernetes, the control plane's "
        "version) as a node without containers: kubemark's hollow kubelet with the real DRA "
        "manager, and a CRI runtime that resolves each container's CDI devices against the "
        "node's CDI directories as containerd does, recording what each container got under "
        "<root>/cri/pods/. Built from tools/controlplane on first use (needs Go).",
    )
    add_arguments(kl)
    kl.set_defaults(func=_kubelet)
