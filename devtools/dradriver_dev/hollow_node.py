"""`dradriver dev kubelet`: one hollow GPU node running the kubelet's own code.

The node is tools/controlplane/cmd/hollow-node, built from the same Kubernetes Go
modules as the control plane: kubemark's hollow kubelet with the kubelet's real DRA
manager wired in, and a CRI runtime that resolves CDI devices with the CDI reference
library as containerd does. This module only builds (or finds) that binary and hands
the process over to it, so signals and exit codes are the kubelet's own.

What a test or the demo can read from a node's root directory:
  plugins_registry/, plugins/     the kubelet's plugin sockets (the plugin's --kubelet-dir)
  cdi/                            the CDI spec directory the runtime resolves from
  cri/pods/<pod-uid>/<ctr>.json   what each running container received (env, device
                                  nodes, mounts, hooks, CDI IDs), gone with the pod
  cri/processes/<ctr-id>.log      the output of the containers run as host processes
                                  (--exec-image: the driver's daemon pods)
  dra_manager_state               the kubelet's own DRA checkpoint
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dradriver.k8s.lines import OLDEST, Line, line
from dradriver_dev import cluster

BUILD_SCRIPT = cluster.REPO_ROOT / "tools" / "controlplane" / "build.sh"
BINARY = "hollow-node"

# Gates the kubelet gets when the control plane runs the alpha DRA gates: those of its
# own line that are off by default (the health service, KEP-4680's ResourceHealthStatus,
# and the DRA features whose kubelet half exists), none from 1.36.
KUBELET_ALPHA_GATES = cluster.ALPHA_GATES

# klog verbosity: 3 is where the DRA manager logs its slice wipes and plugin changes.
LOG_VERBOSITY = {"debug": 3, "info": 2, "warning": 0, "error": 0}


# The image of the daemons a plugin on a dev node runs as pods of their own (its
# --daemon-image): the hollow node's runtime runs such containers as processes of this
# host, so an MPS or IMEX daemon really runs, and outlives the plugin, as it does on a
# real node. Every other container only pretends to run.
HOST_IMAGE = "dradriver.dev/host-process:dev"


class HollowNodeError(RuntimeError):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", required=True, help="the node's name")
    p.add_argument(
        "--root",
        required=True,
        help="kubelet root directory: plugins_registry/, plugins/, pods/, the DRA "
        "checkpoint; the kubelet plugin's --kubelet-dir",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="credentials allowed to create and approve the node's client certificate "
        "request (the dev cluster's admin kubeconfig); the node itself then acts as "
        "system:node:<name> (default: $KUBECONFIG)",
    )
    p.add_argument(
        "--cdi-dir",
        action="append",
        default=None,
        help="CDI spec directory the runtime resolves devices from; repeatable, later ones "
        "take priority (default: <root>/cdi)",
    )
    p.add_argument(
        "--exec-image",
        action="append",
        default=None,
        metavar="IMAGE",
        help="an image whose containers run as processes of this host, with their command "
        f"and environment; repeatable (default: {HOST_IMAGE}, a dev plugin's --daemon-image)",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Node label; repeatable",
    )
    p.add_argument(
        "--alpha",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="give the kubelet the alpha DRA gates (ResourceHealthStatus, ...); default: "
        "on when the API server serves resource.k8s.io/v1alpha3, as `make cluster-up "
        "ALPHA=1` does",
    )
    p.add_argument(
        "--kubernetes",
        default=None,
        metavar="LINE",
        help="the kubelet's Kubernetes line, 1.34 to 1.37 (default: $K8S, else 1.34); a "
        "kubelet may be up to three minors older than the API server",
    )
    p.add_argument(
        "--feature-gates",
        default="",
        help="more kubelet feature gates, e.g. SomeGate=true (added after --alpha's)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=sorted(LOG_VERBOSITY),
        help="the kubelet's log verbosity; debug shows the DRA manager's slice wipes and "
        "plugin changes (default: %(default)s)",
    )


def kubelet_line(args: argparse.Namespace) -> Line:
    if args.kubernetes:
        try:
            return line(args.kubernetes)
        except ValueError as exc:
            raise HollowNodeError(f"--kubernetes {args.kubernetes}: {exc}") from exc
    try:
        return cluster.current_line()
    except cluster.ClusterError as exc:
        raise HollowNodeError(str(exc)) from exc


def build(ln: Line | None = None) -> Path:
    """Builds (or finds cached) the hollow node binary of the line (default: $K8S);
    progress goes to stderr."""
    ln = ln or cluster.current_line()
    if not BUILD_SCRIPT.exists():
        raise HollowNodeError(f"{BUILD_SCRIPT} is missing: run from a dradriver checkout")
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "node"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, cluster.LINE_ENV: ln.name},
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise HollowNodeError(f"building the {ln.name} hollow node failed (exit {proc.returncode})")
    return Path(proc.stdout.strip().splitlines()[-1]) / BINARY


def _alpha_served(kubeconfig: str) -> bool:
    from dradriver.k8s import Kube, KubeError

    try:
        kube = Kube.from_kubeconfig(kubeconfig)
    except (OSError, ValueError):  # dradriver.k8s.config.KubeconfigError is a ValueError
        return False
    try:
        kube.get("/apis/resource.k8s.io/v1alpha3")
        return True
    except KubeError:
        return False
    finally:
        kube.close()


def argv(args: argparse.Namespace, binary: Path, ln: Line = OLDEST) -> list[str]:
    """The hollow node's command line for these arguments, for a kubelet of line `ln`."""
    alpha = args.alpha if args.alpha is not None else _alpha_served(args.kubeconfig)
    gates = [f"{g}=true" for g in cluster.alpha_gates(ln)] if alpha else []
    gates += [g for g in args.feature_gates.split(",") if g]
    out = [
        str(binary),
        f"--node={args.node}",
        f"--root={Path(args.root).resolve()}",
        f"--kubeconfig={Path(args.kubeconfig).resolve()}",
        f"--v={LOG_VERBOSITY[args.log_level]}",
    ]
    out += [f"--cdi-dir={Path(d).resolve()}" for d in args.cdi_dir or []]
    out += [f"--exec-image={i}" for i in args.exec_image or [HOST_IMAGE]]
    out += [f"--label={kv}" for kv in args.label]
    if gates:
        out.append(f"--feature-gates={','.join(gates)}")
    return out


def run(args: argparse.Namespace) -> int:
    if not args.kubeconfig:
        print("dev kubelet: no kubeconfig: pass --kubeconfig or set $KUBECONFIG", file=sys.stderr)
        return 2
    try:
        ln = kubelet_line(args)
        binary = build(ln)
    except HollowNodeError as exc:
        print(f"dev kubelet: {exc}", file=sys.stderr)
        return 1
    cmd = argv(args, binary, ln)
    sys.stdout.flush()
    sys.stderr.flush()
    # The process becomes the kubelet: a test's SIGKILL kills the kubelet, not a wrapper.
    os.execv(cmd[0], cmd)


def host_processes(root: Path) -> list[tuple[int, int]]:
    """(PID, start time) of every process the hollow nodes under `root` run for their
    --exec-image containers that still runs (cri/state.json names them; a PID alone may
    have been reused)."""
    procs: list[tuple[int, int]] = []
    for state in root.glob("**/cri/state.json"):
        try:
            saved = json.loads(state.read_text()).get("processes") or {}
            procs += [(int(p["pid"]), int(p["start"])) for p in saved.values()]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return [(pid, start) for pid, start in procs if _started_at(pid) == start]


def stop_host_processes(root: Path, grace: float = 10.0) -> int:
    """Stops what host_processes finds, as a node's shutdown ends its containers; how
    many ran. They outlive their node by design (containerd's shims outlive the kubelet),
    so tearing down a dev cluster or a test's node must end them."""
    running = host_processes(root)
    for pid, _ in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_started_at(p) == s for p, s in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, start in running:
        if _started_at(pid) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    return len(running)


def _started_at(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])
