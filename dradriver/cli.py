"""The `dradriver` command: one entry point, one subcommand per component."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from dradriver import __version__


def _no_devtools(args: argparse.Namespace) -> int:
    print(
        "dradriver dev: the developer tools (package dradriver_dev) are not installed. They "
        "come with a dradriver checkout: run `make venv` there, or `pip install -e ./devtools`.",
        file=sys.stderr,
    )
    return 2


def _devices(args: argparse.Namespace) -> int:
    from dradriver.commands import devices

    return devices.run(args)


def _explain(args: argparse.Namespace) -> int:
    from dradriver.commands import explain

    return explain.run(args)


def _fleet(args: argparse.Namespace) -> int:
    from dradriver.commands import fleet

    return fleet.run(args)


def _doctor(args: argparse.Namespace) -> int:
    from dradriver.commands import doctor

    return doctor.run(args)


def _kubelet_plugin(args: argparse.Namespace) -> int:
    from dradriver.kubeletplugin.startup import run

    return run(args)


def _controller(args: argparse.Namespace) -> int:
    from dradriver.controller.main import run

    return run(args)


def _add_kubelet_plugin(sub: Any) -> None:
    from dradriver.kubeletplugin.options import add_arguments as plugin_arguments

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


def build_parser(dev_tools: bool = True, only: str = "") -> argparse.ArgumentParser:
    """`dev_tools` False: `dradriver dev` is left without its subcommands, whose modules
    are not imported (main() knows when the command line is not `dev`). `only`
    "kubelet-plugin": that command alone, so that the plugin's first instants go to its
    sockets, not to the other commands' parsers."""
    parser = argparse.ArgumentParser(
        prog="dradriver",
        description="A Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if only == "kubelet-plugin":
        _add_kubelet_plugin(sub)
        return parser

    from dradriver.commands import devices

    dv = sub.add_parser(
        "devices",
        help="show this node's GPUs and the ResourceSlices it would publish (offline)",
        description="Discovers GPUs (through NVML, or a fake) and prints the inventory and "
        "the ResourceSlices the kubelet plugin would publish. Talks to no API server.",
    )
    devices.add_arguments(dv)
    dv.set_defaults(func=_devices)

    from dradriver.commands import doctor, explain

    ex = sub.add_parser(
        "explain",
        help="why a pod's or claim's devices cannot be allocated (read-only)",
        description="Evaluates each request of the claims (DeviceClass and request CEL "
        "selectors, as the scheduler does) against every published device, counts per node "
        "what matches, is taken or blocked, and names the first step that fails, with its "
        "layer and its fix. Exit status: 0 nothing blocks, 1 a cause was found, 2 an error.",
    )
    explain.add_arguments(ex)
    ex.set_defaults(func=_explain)

    dr = sub.add_parser(
        "doctor",
        help="walk a GPU node's layers bottom-up and name the first broken one",
        description="Checks, in order: the NVIDIA driver and NVML, the CDI directories and "
        "the runtime's CDI setting, the plugin's registration with the kubelet (/readyz), "
        "the published ResourceSlices against NVML, the node (cordon, taints), the "
        "DeviceClasses and the feature gates the MIG mode needs. One line per layer; exit "
        "status 1 at the first broken layer, 0 when all are ok.",
    )
    doctor.add_arguments(dr)
    dr.set_defaults(func=_doctor)

    from dradriver.commands import fleet

    fl = sub.add_parser(
        "fleet",
        help="the fleet's GPUs: per node and product, what still fits, what is stranded",
        description="Reads every ResourceSlice, ResourceClaim, DeviceClass, Node and Pending "
        "pod once, and shows per node and product the GPUs published, allocated, carved into "
        "MIG partitions, tainted and free; what each node can still place (1, 2, 4, 8 GPUs, "
        "in one NVLink domain, each MIG profile); and the stranded GPUs: free ones that no "
        "Pending pod's claim can use where they are, with the reason (wrong product, "
        "fragmented across NVLink domains, too few free on the node, MIG layout) and, with "
        "--price-per-gpu-hour, what they cost. Read-only.",
    )
    fleet.add_arguments(fl)
    fl.set_defaults(func=_fleet)

    _add_kubelet_plugin(sub)

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

    dev = sub.add_parser(
        "dev",
        help="tools for driver developers, in a checkout (local cluster, hollow nodes)",
        description="Developer tools: they come with a dradriver checkout (`make venv`), "
        "not with the product.",
    )
    try:
        if not dev_tools:
            raise ImportError("not needed for this command")
        from dradriver_dev.cli import add_subcommands
    except ImportError:
        dev.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        dev.set_defaults(func=_no_devtools)
    else:
        add_subcommands(dev)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    # Only `dev` (or help on everything) needs the developer tools' parsers.
    first = words[0] if words else ""
    parser = build_parser(dev_tools=first in ("", "dev"), only=first)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # `dradriver devices -o json | head`: the reader left, which is no error of ours.
        # Python would report the flush at exit again; point stdout at nothing first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
