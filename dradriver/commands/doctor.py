"""`dradriver doctor`: gathers each layer's facts (NVML and the CDI directory when run on
the node, see node_facts.py; the plugin's /readyz, the API server's objects and gates)
and prints the walk."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver import DEFAULT_DRIVER_NAME

# The Kubernetes client loads when the command runs, not whenever the parser is built.
if TYPE_CHECKING:
    from dradriver.commands.dev_nodes import DevNode
    from dradriver.diagnose.doctor import Layer
    from dradriver.k8s import Kube

Obj = Mapping[str, Any]
OLD_PLUGIN_RETRIES = 3
STATE_DIR = "/var/lib/dradriver"
CDI_DIR = "/var/run/cdi"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"


def _env(flag: str, default: str | None = None) -> str | None:
    return os.environ.get("DRADRIVER_" + flag.upper().replace("-", "_"), default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--node",
        default=None,
        help="the node to check (default: every node of a dev cluster, else $NODE_NAME, "
        "else this host's name)",
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: $KUBECONFIG); a dev cluster's (make demo KEEP=1: "
        ".devcluster/kubeconfig) has a registry of its nodes beside it, and doctor then "
        "checks every layer of each, finding its plugin's /readyz and directories there",
    )
    p.add_argument(
        "--driver-name",
        default=_env("driver-name", DEFAULT_DRIVER_NAME),
        help="the driver's name (default: $DRADRIVER_DRIVER_NAME, else %(default)s)",
    )
    p.add_argument(
        "--devices",
        default=None,
        help="check NVML and the CDI directory here, on the node, with this device backend "
        "(nvml, or fake:<spec> as the plugin was given; default: $DRADRIVER_DEVICES, set in "
        "the plugin pod; without it only the cluster side is checked)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="the plugin's state directory (fake devices keep their MIG state there; "
        f"default: $DRADRIVER_STATE_DIR, else {STATE_DIR})",
    )
    p.add_argument(
        "--cdi-dir",
        default=None,
        help="the CDI directory the plugin writes to (default: $DRADRIVER_CDI_DIR, else "
        f"{CDI_DIR})",
    )
    p.add_argument(
        "--driver-files",
        choices=["cdi", "runtime"],
        default=None,
        help="how the plugin gives containers the driver's files, for the driver-spec check "
        "(default: $DRADRIVER_DRIVER_FILES, else cdi)",
    )
    p.add_argument(
        "--mig-mode",
        choices=["none", "static", "dynamic"],
        default=None,
        help="the plugin's MIG mode, for the feature-gate check (default: $DRADRIVER_MIG_MODE,"
        " else read from the published slices)",
    )
    p.add_argument(
        "--readyz",
        default=None,
        help="URL of the plugin's /readyz (default: http://127.0.0.1:$DRADRIVER_HEALTHZ_PORT"
        "/readyz on the node; through the API server's pod proxy otherwise)",
    )
    p.add_argument(
        "--containerd-config",
        default=None,
        help="containerd's config, read for its CDI setting when it exists (default: "
        f"{CONTAINERD_CONFIG}; none for a dev node, whose runtime is the hollow node's)",
    )
    p.add_argument(
        "--daemon-namespace",
        default=_env("daemon-namespace"),
        help="where the plugin runs its MPS and IMEX daemons' pods (default: "
        "$DRADRIVER_DAEMON_NAMESPACE, set in the plugin pod; else every namespace)",
    )
    p.add_argument(
        "-o", "--output", choices=["text", "json"], default="text", help="text or json lines"
    )


def _http(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(getattr(e, "reason", e))


def _plugin(args: argparse.Namespace, kube: Kube) -> Layer:
    from dradriver.commands.cluster_facts import items
    from dradriver.diagnose import doctor_plugin as judge
    from dradriver.diagnose.doctor import Layer, State
    from dradriver.k8s import KubeError, path_for

    url = args.readyz
    if not url and args.devices:
        url = f"http://127.0.0.1:{_env('healthz-port', '8081')}/readyz"
    if url:
        code, body = _http(url)
        for _ in range(OLD_PLUGIN_RETRIES):
            if "not checked yet" not in body:
                break
            # A plugin older than this doctor starts its API probe on the first /readyz.
            time.sleep(1.0)
            code, body = _http(url)
        return judge.registration(url, code, body, dev_log=args.dev_log)
    # From afar: the plugin pod on that node, through the API server's pod proxy.
    pods = items(
        kube,
        path_for("v1", "pods"),
        labelSelector="app.kubernetes.io/component=kubelet-plugin",
        fieldSelector=f"spec.nodeName={args.node}",
    )
    if not pods:
        return Layer(
            "plugin",
            State.FAIL,
            f"no kubelet-plugin pod runs on node {args.node}.",
            "check the DaemonSet's node selector and tolerations (Helm kubeletPlugin.*), or "
            "pass --readyz URL when the plugin runs outside a pod",
        )
    pod = pods[0]
    meta = pod["metadata"]
    port = next(
        (
            p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports") or []
            if "health" in p.get("name", "")
        ),
        8081,
    )
    where = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}:{port}/proxy/readyz"
    try:
        return judge.registration(where, 200, kube.text(where, timeout=5))
    except KubeError as exc:
        if exc.status == 503:
            return Layer(
                "plugin",
                State.FAIL,
                f"pod {meta['namespace']}/{meta['name']} is not ready.",
                f"run doctor in it for the reason: kubectl -n {meta['namespace']} exec "
                f"{meta['name']} -- dradriver doctor",
            )
        return judge.registration(where, 0, exc.message)


def _daemons(args: argparse.Namespace, kube: Kube) -> Layer | None:
    """The node's daemon pods (MPS, IMEX) and whether each serves."""
    from dradriver.commands.cluster_facts import FactsError, items
    from dradriver.diagnose import daemons
    from dradriver.diagnose.doctor import Layer, State
    from dradriver.k8s import path_for

    ns = getattr(args, "daemon_namespace", None)
    try:
        pods = items(
            kube,
            path_for("v1", "pods", ns),
            labelSelector=daemons.SELECTOR,
            fieldSelector=f"spec.nodeName={args.node}",
        )
    except FactsError as exc:
        return Layer("daemons", State.SKIP, f"cannot list the node's daemon pods: {exc}")
    return daemons.layer(args.node, pods)


def _mig_mode(args: argparse.Namespace, published: list[Obj]) -> str | None:
    if args.mig_mode:
        return str(args.mig_mode)
    if any(s.get("spec", {}).get("sharedCounters") for s in published):
        return "dynamic"
    return None


def _uses(args: argparse.Namespace) -> set[str]:
    """The gates of features the node's plugin is configured for, besides dynamic MIG
    (_mig_mode): shares by memory. The others (health taints, binding conditions) the
    plugin publishes without, saying so: doctor warns of them."""
    consumable = getattr(args, "consumable_capacity", None) or _env("consumable-capacity")
    return {"DRAConsumableCapacity"} if consumable not in (None, "", "off") else set()


def walk(args: argparse.Namespace, emit: Callable[[Layer], None]) -> int:
    from dradriver.commands import node_facts
    from dradriver.commands.cluster_facts import (
        RES,
        FactsError,
        connect,
        feature_gates,
        get,
        items,
    )
    from dradriver.diagnose import doctor_cluster as judge
    from dradriver.diagnose.doctor import Layer, State
    from dradriver.k8s import NotFound, path_for

    def step(layer: Layer) -> bool:
        emit(layer)
        return layer.state is not State.FAIL

    nvml_layer, uuids, release = node_facts.nvml(args)
    if not step(nvml_layer) or not step(node_facts.cdi(args)):
        return 1
    step(node_facts.driver_files(args, release))  # a container without the driver still starts
    try:
        kube = connect(args.kubeconfig)
    except FactsError as exc:
        step(Layer("api-server", State.FAIL, str(exc)))
        return 1
    try:
        try:
            version = get(kube, "/version")
        except (FactsError, NotFound) as exc:
            step(Layer("api-server", State.FAIL, str(exc)))
            return 1
        step(
            Layer(
                "api-server",
                State.OK,
                f"{kube.host} answers (Kubernetes {version.get('gitVersion', '?')})",
            )
        )
        if not step(_plugin(args, kube)):
            return 1
        published = [
            s
            for s in items(kube, path_for(RES, "resourceslices"))
            if s["spec"].get("driver") == args.driver_name
            and s["spec"].get("nodeName") == args.node
        ]
        if not step(judge.slices(args.driver_name, args.node, published, nvml_uuids=uuids)):
            return 1
        try:
            node_obj: Obj | None = get(kube, path_for("v1", "nodes", name=args.node))
        except NotFound:
            node_obj = None
        if not step(judge.node(args.node, node_obj)):
            return 1
        imex_layer = judge.imex(published, node_obj)
        if imex_layer is not None:
            step(imex_layer)  # a warning at most: every other layer still counts
        daemons_layer = _daemons(args, kube)
        if daemons_layer is not None:
            step(daemons_layer)  # a warning at most: the node itself serves
        if not step(
            judge.device_classes(args.driver_name, items(kube, path_for(RES, "deviceclasses")))
        ):
            return 1
        uses = _uses(args)
        gates = feature_gates(kube)
        server = str(version.get("gitVersion", ""))
        if not step(judge.feature_gates(server, uses, gates, mig_mode=_mig_mode(args, published))):
            return 1
    except FactsError as exc:
        step(Layer("api-server", State.FAIL, str(exc)))
        return 1
    finally:
        kube.close()
    return 0


def node_args(args: argparse.Namespace, dev: DevNode | None) -> argparse.Namespace:
    """One node's flags: those given, else its dev registry entry's, else those of the
    plugin pod ($DRADRIVER_*) and the defaults of a node whose plugin runs in a pod."""
    n = argparse.Namespace(**vars(args))
    if dev is not None:
        n.node = dev.node
        n.readyz = args.readyz or dev.readyz
        n.devices = args.devices or dev.devices
        n.state_dir = args.state_dir or dev.state_dir
        n.cdi_dir = args.cdi_dir or dev.cdi_dir
        n.mig_mode = args.mig_mode or dev.mig_mode
        n.driver_files = args.driver_files or "cdi"  # what the demo runs
        n.dev_log = dev.plugin_log
        return n
    n.node = args.node or os.environ.get("NODE_NAME") or _env("node-name") or socket.gethostname()
    # The plugin pod sets these: `kubectl exec` into it runs doctor with its flags.
    n.devices = args.devices or _env("devices")
    n.state_dir = args.state_dir or _env("state-dir", STATE_DIR)
    n.cdi_dir = args.cdi_dir or _env("cdi-dir", CDI_DIR)
    n.mig_mode = args.mig_mode or _env("mig-mode")
    n.driver_files = args.driver_files or _env("driver-files", "cdi")
    n.containerd_config = args.containerd_config or CONTAINERD_CONFIG
    n.dev_log = ""
    return n


def targets(args: argparse.Namespace) -> tuple[list[argparse.Namespace], Path | None]:
    """The nodes to check: every node of a dev cluster unless --node names one, else the
    one node; and the dev cluster's directory, if any."""
    from dradriver.commands import dev_nodes

    where = dev_nodes.cluster_dir(args.kubeconfig)
    registered = dev_nodes.load(where) if where else []
    if args.node is not None:
        dev = next((d for d in registered if d.node == args.node), None)
        return [node_args(args, dev)], where if dev else None
    if registered:
        return [node_args(args, d) for d in registered], where
    return [node_args(args, None)], None


def run(args: argparse.Namespace) -> int:
    from dradriver.commands.dev_nodes import RegistryError
    from dradriver.diagnose import doctor as judge

    node = ""
    first: dict[str, Layer] = {}  # each node's first broken layer

    def emit(layer: Layer) -> None:
        if layer.state is judge.State.FAIL:
            first.setdefault(node, layer)
        if args.output == "json":
            doc = {"layer": layer.name, "state": layer.state.value, "text": layer.text}
            print(json.dumps({**({"node": node} if node else {}), **doc, "fix": layer.fix}))
        else:
            print(layer.line())
        sys.stdout.flush()

    try:
        nodes, dev_cluster = targets(args)
    except RegistryError as exc:
        print(f"doctor: {exc}; `make cluster-down` removes a dev cluster", file=sys.stderr)
        return 2
    if dev_cluster is None:
        return walk(nodes[0], emit)
    for n in nodes:
        node = n.node
        if args.output == "text":
            print(f"node {n.node} (dev node, {dev_cluster / 'nodes' / n.node}.json):")
        walk(n, emit)
    broken = [(n.node, first.get(n.node)) for n in nodes]
    if args.output == "text":
        print(judge.dev_summary(broken))
    return 1 if any(layer for _, layer in broken) else 0
