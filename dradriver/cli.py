"""The `dradriver` command: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dradriver import __version__


def _dev_cluster(args: argparse.Namespace) -> int:
    from dradriver.dev import cluster

    state_dir = Path(args.state_dir)
    if args.action == "up":
        try:
            st = cluster.up(state_dir, alpha=args.alpha)
        except cluster.ClusterError as exc:
            print(f"dev cluster: {exc}", file=sys.stderr)
            return 1
        gates = "alpha DRA gates on" if st.alpha else "GA defaults"
        print(f"dev cluster: up at {st.server} ({gates})")
        print(f"dev cluster: export KUBECONFIG={st.kubeconfig}")
        print(
            f"dev cluster: kubectl {state_dir / 'kubectl'} --kubeconfig {st.kubeconfig} get nodes"
        )
        return 0
    stopped = cluster.down(state_dir)
    print("dev cluster: stopped and removed" if stopped else "dev cluster: nothing was running")
    return 0


def _dev_kubelet(args: argparse.Namespace) -> int:
    from dradriver.dev.kubelet import run

    return run(args)


def _devices(args: argparse.Namespace) -> int:
    from dradriver.commands import devices

    return devices.run(args)


def _kubelet_plugin(args: argparse.Namespace) -> int:
    from dradriver.kubeletplugin.main import run

    return run(args)


def _controller(args: argparse.Namespace) -> int:
    from dradriver.controller.main import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver",
        description="A Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from dradriver.commands import devices
    from dradriver.kubeletplugin.main import add_arguments as plugin_arguments

    dv = sub.add_parser(
        "devices",
        help="show this node's GPUs and the ResourceSlices it would publish (offline)",
        description="Discovers GPUs (through NVML, or a fake) and prints the inventory and "
        "the ResourceSlices the kubelet plugin would publish. Talks to no API server.",
    )
    devices.add_arguments(dv)
    dv.set_defaults(func=_devices)

    kp = sub.add_parser(
        "kubelet-plugin",
        help="the node component: publish this node's GPUs and prepare claimed devices",
        description="Discovers the node's GPUs, publishes them as ResourceSlices, registers "
        "with the kubelet and serves the DRA gRPC API (v1 and v1beta1): prepares claimed "
        "devices with one CDI spec per claim, and unprepares them. Every flag can also be "
        "set through the DRADRIVER_* environment variable named after it.",
    )
    plugin_arguments(kp)
    kp.set_defaults(func=_kubelet_plugin)

    from dradriver.controller.main import add_arguments as controller_arguments

    ct = sub.add_parser(
        "controller",
        help="the cluster component: the admission webhook for claims and claim templates",
        description="Serves a validating admission webhook over HTTPS that refuses "
        "ResourceClaims and ResourceClaimTemplates whose configs for this driver do not "
        "decode, or name requests the claim does not have. Makes its own CA and serving "
        "certificate and patches the CA into the ValidatingWebhookConfiguration, unless "
        "--tls-cert-file/--tls-key-file are given. Every flag can also be set through the "
        "DRADRIVER_* environment variable named after it.",
    )
    controller_arguments(ct)
    ct.set_defaults(func=_controller)

    dev = sub.add_parser("dev", help="tools for driver developers (local cluster, hollow nodes)")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="TOOL")

    cl = dev_sub.add_parser("cluster", help="start or stop the local Kubernetes control plane")
    cl.add_argument("action", choices=["up", "down"])
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
    cl.set_defaults(func=_dev_cluster)

    from dradriver.dev.kubelet import add_arguments

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
    kl.set_defaults(func=_dev_kubelet)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
