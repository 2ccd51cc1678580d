"""`make demo`: the whole driver on one machine, no GPUs and no cluster needed.

A local Kubernetes control plane of the line $K8S names (1.34 when unset; every DRA
feature the driver has on: the alpha gates on 1.34 and 1.35) with the DeviceClasses and
the admission webhook, two hollow nodes (the kubelet's own code, with a runtime that
resolves CDI) with fake GPUs, one kubelet plugin per node, a claim with a bad config
refused at apply time, every example claim applied, and a summary of what each pod
received. `KEEP=1 make demo` leaves everything running for kubectl.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dradriver.commands import dev_nodes
from dradriver.k8s import Conflict, Kube, KubeError, NotFound, path_for
from dradriver_dev import addons, cluster, driver_files, ports
from dradriver_dev import demo_domains as domains
from dradriver_dev import demo_gang as gang
from dradriver_dev import hollow_node as hollow

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".devcluster"
# Where a run's logs are kept once the cluster (and .devcluster with it) is gone.
KEPT_LOGS = REPO / "build" / "demo-logs"
NAMESPACE = "demo"
RES = "resource.k8s.io/v1"
NODES = {
    # node name: (devices, MIG mode)
    "h100-node": ("fake:8xH100-80GB", "dynamic"),
    "mixed-node": ("fake:4xA100-80GB:nvlink=pairs+2xL4", "none"),
    "shared-node": ("fake:1xH100-80GB", "none"),
    # Two GB200 trays of one NVL72 rack's fabric clique: the ComputeDomain job's nodes.
    **{t: (f"fake:@{domains.TRAY}", "none") for t in domains.TRAYS},
}
# Further plugin flags of a node: the shared node's GPU goes to several claims by memory;
# the trays publish IMEX channels (their daemons' ports are chosen at start).
PLUGIN_ARGS = {
    "shared-node": ["--consumable-capacity", "memory"],
    **{t: ["--imex-channels", "on"] for t in domains.TRAYS},
}
SHOWN_ENV = (
    "NVIDIA_VISIBLE_DEVICES",
    "DRADRIVER_CLAIM",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "DRADRIVER_SHARE_ID",
    "DRADRIVER_SHARE_MEMORY_LIMIT",
)
# Which node each example belongs on, so the summary shows both nodes at work.
PLACEMENT = {
    "gpu-by-memory": "mixed-node",
    "prioritized-list": "mixed-node",
    **{p: "shared-node" for p in ("share-a", "share-b", "share-c")},
}


@functools.cache
def imex_ports() -> tuple[int, int]:
    """The trays' IMEX daemons' SERVER_PORT and IMEX_CMD_PORT: one pair for all, as real
    nodes share one; chosen once per demo."""
    server, cmd = ports.free_ports(2)
    return server, cmd


def say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


@dataclass
class NodeProcs:
    name: str
    root: Path
    state: Path
    procs: list[subprocess.Popen[bytes]]
    healthz_port: int  # the plugin's /healthz, /readyz and /metrics

    def endpoints(self) -> str:
        base = f"http://127.0.0.1:{self.healthz_port}"
        return f"node {self.name}: readyz {base}/readyz metrics {base}/metrics"

    def readyz(self) -> str:
        """What the plugin's /readyz answers now, proof the address shown is its own."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.healthz_port}/readyz", timeout=2
            ) as r:
                return f"{r.status} ready"
        except urllib.error.HTTPError as e:
            return f"{e.code} not ready yet: {e.read().decode(errors='replace').strip()}"
        except OSError as e:
            return f"not answering: {e}"


def start_node(
    kube: Kube, name: str, devices: str, mode: str, kubeconfig: str, logs: Path
) -> NodeProcs:
    root = STATE / "nodes" / name
    state = STATE / "nodes" / f"{name}-state"
    for d in (root, state):
        d.mkdir(parents=True, exist_ok=True)
    # The driver's files in CDI, from a fake driver root of the fake GPUs' version.
    env = driver_files.plugin_env({**os.environ, "PYTHONUNBUFFERED": "1"}, devices)
    common = [sys.executable, "-m", "dradriver.cli"]
    kubelet = subprocess.Popen(
        [
            *common,
            "dev",
            "kubelet",
            "--node",
            name,
            "--root",
            str(root),
            "--kubeconfig",
            kubeconfig,
            "--alpha",
            *(domains.kubelet_args(name) if name in domains.TRAYS else []),
        ],
        stdout=open(logs / f"{name}-kubelet.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    # A starting kubelet deletes its node's slices: let it, before the plugin publishes.
    wait(f"node {name} Ready", lambda: _node_ready(kube, name, kubelet))
    # Chosen here rather than 0 ("any"), so the address the demo prints is known without
    # reading the plugin's log; the plugin exits if another process took it meanwhile.
    (healthz_port,) = ports.free_ports(1)
    plugin = subprocess.Popen(
        [
            *common,
            "kubelet-plugin",
            "--node-name",
            name,
            "--devices",
            devices,
            "--mig-mode",
            mode,
            "--kubeconfig",
            kubeconfig,
            "--kubelet-dir",
            str(root),
            "--cdi-dir",
            str(root / "cdi"),
            "--state-dir",
            str(state),
            "--healthz-address",
            "127.0.0.1",
            "--healthz-port",
            str(healthz_port),
            # Its MPS and IMEX daemons as pods the hollow node runs as host processes.
            "--daemon-image",
            hollow.HOST_IMAGE,
            # The fake GPUs' driver is 570 (MPS v2): the demo's shares, one tenant's.
            "--mps-v2-shares",
            "allow",
            *PLUGIN_ARGS.get(name, []),
            *(domains.plugin_args(imex_ports()) if name in domains.TRAYS else []),
        ],
        stdout=open(logs / f"{name}-plugin.log", "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    # What `dradriver doctor` needs to find this node's plugin, a process no pod points at.
    dev_nodes.write(
        STATE,
        dev_nodes.DevNode(
            node=name,
            readyz=f"http://127.0.0.1:{healthz_port}/readyz",
            devices=devices,
            mig_mode=mode,
            cdi_dir=str(root / "cdi"),
            state_dir=str(state),
            kubelet_dir=str(root),
            plugin_log=str(logs / f"{name}-plugin.log"),
        ),
    )
    return NodeProcs(name, root, state, [kubelet, plugin], healthz_port)


def _node_ready(kube: Kube, name: str, kubelet: subprocess.Popen[bytes]) -> bool:
    if kubelet.poll() is not None:
        raise RuntimeError(f"the kubelet of {name} exited; see .devcluster/logs/{name}-kubelet.log")
    try:
        conds = kube.get(path_for("v1", "nodes", name=name)).get("status", {}).get("conditions")
    except NotFound:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds or [])


def wait(what: str, fn: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            v = fn()
        except KubeError:
            v = None
        if v:
            return v
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {what}")


# Examples the demo does not apply with the rest: a job for a sick GPU (the demo makes one
# sick later, and that job would take a healthy GPU another example needs meanwhile).
# The shares=4 and unlimited examples need a node in their own mode (the e2e tests run
# them); the demo's shared node is in memory mode.
# The ComputeDomain job has its own part of the demo, on the GB200 trays, and the pod
# asking nvidia.com/gpu its own, after the sick GPU (it would take the GPU that step uses).
NOT_APPLIED = {
    "computedomain-job.yaml",
    "nvidia-com-gpu-pod.yaml",
    "gpu-tolerating-unhealthy.yaml",
    "gpu-share-of-four.yaml",
    "gpu-share-unlimited.yaml",
}


def not_on(nodes: list[str]) -> dict[str, Any]:
    """A pod affinity that keeps a pod off these nodes."""
    term = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": nodes}
    required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def example_documents() -> Iterator[dict[str, Any]]:
    """Every object of the examples the demos apply (all but NOT_APPLIED), in file order;
    `make kind-demo` places and runs them its own way."""
    for f in sorted((REPO / "examples" / "claims").glob("*.yaml")):
        if f.name not in NOT_APPLIED:
            yield from (doc for doc in yaml.safe_load_all(f.read_text()) if doc)


def apply_examples(kube: Kube) -> list[str]:
    pods = []
    for doc in example_documents():
        if doc["kind"] == "Pod":
            node = PLACEMENT.get(doc["metadata"]["name"])
            if node:
                doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            else:  # the shared node's GPU is for the shares alone
                doc["spec"]["affinity"] = not_on(list(PLUGIN_ARGS))
            pods.append(doc["metadata"]["name"])
        plural = {
            "Pod": "pods",
            "ResourceClaimTemplate": "resourceclaimtemplates",
            "ResourceClaim": "resourceclaims",
        }[doc["kind"]]
        kube.create(path_for(doc["apiVersion"], plural, NAMESPACE), doc)
    return pods


def device_facts(kube: Kube, pool: str, device: str) -> dict[str, Any]:
    for s in kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={pool}")[
        "items"
    ]:
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return {k: next(iter(v.values())) for k, v in d["attributes"].items()}
    return {}


def summary(kube: Kube, pods: list[str], nodes: dict[str, NodeProcs]) -> str:
    out = []
    for name in pods:
        pod = kube.get(path_for("v1", "pods", NAMESPACE, name=name))
        st = pod.get("status", {})
        node = pod["spec"].get("nodeName", "-")
        phase = st.get("phase", "?")
        out.append(f"\npod {name}: {phase} on {node}")
        waiting = [
            c["state"]["waiting"]
            for c in st.get("containerStatuses", [])
            if "waiting" in c.get("state", {})
        ]
        for w in waiting:
            out.append(f"  waiting: {w.get('reason')}: {w.get('message', '')}")
        generated = {
            c["name"]: c.get("resourceClaimName") for c in st.get("resourceClaimStatuses") or []
        }
        for rc in pod["spec"].get("resourceClaims") or []:
            claim_name = rc.get("resourceClaimName") or generated.get(rc["name"])
            if not claim_name:
                continue
            claim = kube.get(path_for(RES, "resourceclaims", NAMESPACE, name=claim_name))
            alloc = (claim.get("status") or {}).get("allocation")
            if not alloc:
                out.append(f"  claim {claim_name}: not allocated")
                continue
            for r in alloc["devices"]["results"]:
                f = device_facts(kube, r["pool"], r["device"])
                what = f.get("productName", "?")
                if f.get("type") == "mig":
                    # The placement is the name's last part: gpu-9b3c2810-mig-3g40gb-4.
                    at = r["device"].split("-ci")[0].rsplit("-", 1)[-1]
                    what += f", MIG {f.get('profile')} at placement {at}"
                uuid = f.get("uuid") or f.get("parentUUID", "")
                out.append(f"  {r['request']}: {r['device']} ({what}) {uuid}")
        if node in nodes:
            # What the node's runtime gave each container, CDI edits applied.
            recs = sorted(
                (nodes[node].root / "cri" / "pods" / pod["metadata"]["uid"]).glob("*.json")
            )
            for rec in recs:
                got = json.loads(rec.read_text())
                shown = [e for e in got["env"] if e.split("=")[0] in SHOWN_ENV]
                out.append(f"  container {rec.stem} env: " + "; ".join(shown))
                out.append(f"  container {rec.stem} driver: {driver_files_of(got)}")
    return "\n".join(out)


def driver_files_of(container: dict[str, Any]) -> str:
    """The driver's files the runtime gave a container (the node's driver spec, from
    NVIDIA's toolkit): the libraries and commands by name, and the hooks it ran."""
    paths = [m["containerPath"] for m in container.get("mounts") or []]
    libs = sorted({Path(p).name for p in paths if "/lib" in p and ".so" in p})
    cmds = sorted({Path(p).name for p in paths if "/bin/" in p})
    hooks = sorted({h["args"][1] for h in container.get("hooks") or [] if len(h["args"]) > 1})
    if not libs:
        return "none (a container without GPUs)"
    named = ", ".join(n for n in libs if n.startswith(("libcuda.", "libnvidia-ml.")))
    return f"{len(libs)} libraries ({named}, ...), {', '.join(cmds)}; hooks {', '.join(hooks)}"


def mig_layout(nodes: dict[str, NodeProcs]) -> str:
    from dradriver.inventory.naming import stable_names
    from fakenvml import load

    out = ["", "MIG layout (what NVML reports on each node now):"]
    for name, (devices, mode) in NODES.items():
        if mode != "dynamic":
            continue
        fake = load(devices.removeprefix("fake:"), node=name, state_dir=nodes[name].state)
        # Each GPU under the device name the node publishes (from its UUID).
        named = stable_names([g.uuid for g in fake.machine.gpus])
        for gpu in fake.machine.gpus:
            gis = sorted(gpu.gpu_instances.values(), key=lambda g: g.start)
            layout = ", ".join(f"{g.profile.name}@{g.start}" for g in gis) or "no MIG devices"
            mode_s = "MIG on" if gpu.mig_enabled else "MIG off"
            out.append(f"  {name} {named[gpu.uuid]}: {mode_s}: {layout}")
    return "\n".join(out)


HELM_BUILD = REPO / "tools" / "helm" / "build.sh"
CHART = REPO / "deploy" / "helm" / "dradriver"
# What the demo takes from the chart. The rest (DaemonSet, Deployment, RBAC) is for a real
# cluster with the image; here the plugins and the webhook run as processes on loopback
# (the webhook's configuration is the chart's, addons.webhook_configuration).
CHART_OBJECTS = {
    "DeviceClass": "deviceclasses",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def chart_objects() -> list[dict[str, Any]]:
    """The chart's DeviceClasses and its own-node ResourceSlice policy, rendered by helm
    (built, or found cached, by tools/helm/build.sh)."""
    build = subprocess.Popen(
        ["bash", str(HELM_BUILD)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert build.stdout is not None and build.stderr is not None
    for line in build.stderr:
        # A cold build's progress is worth seeing as it goes; a cache hit is not demo output.
        if " cached in " not in line:
            print(line, end="", file=sys.stderr, flush=True)
    out = build.stdout.read()
    if build.wait() != 0:
        raise RuntimeError(f"building helm failed (exit {build.returncode})")
    helm = Path(out.strip().splitlines()[-1]) / "helm"
    only = ["templates/deviceclasses.yaml", "templates/resourceslice-policy.yaml"]
    # The extended-resource class too: the demo's control plane has DRAExtendedResource.
    rendered = subprocess.run(
        [str(helm), "template", "dradriver", str(CHART), "--namespace", "dradriver"]
        + ["--set", "extendedResourceClass.enabled=true,featureGates.DRAExtendedResource=true"]
        + [a for t in only for a in ("--show-only", t)],
        capture_output=True,
        text=True,
    )
    if rendered.returncode != 0:
        raise RuntimeError(f"helm template failed: {rendered.stderr.strip()}")
    return [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] in CHART_OBJECTS]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make demo")
    p.add_argument("--keep", action="store_true", help="leave everything running")
    args = p.parse_args(argv)
    start = time.monotonic()
    ln = cluster.current_line()
    say(f"building (or finding) the Kubernetes {ln.name} control plane ({ln.release})")
    bins = cluster.build_binaries(ln)
    say(
        f"building (or finding) the hollow node: the {ln.name} kubelet with a CDI-resolving runtime"
    )
    hollow.build(ln)
    cluster.down(STATE)
    gates = cluster.alpha_gates(ln)
    say(
        "starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager "
        + (f"(gates {', '.join(gates)} on)" if gates else f"({ln.name}'s default gates)")
        + ", the DeviceClasses and the admission webhook (dradriver controller)"
    )
    st = cluster.up(STATE, alpha=True, bin_dir=bins, replace_partial=True, webhook=True, k8s=ln)
    kube = Kube.from_kubeconfig(st.kubeconfig)
    logs = STATE / "logs"
    nodes: dict[str, NodeProcs] = {}
    try:
        for doc in chart_objects():
            with contextlib.suppress(Conflict):
                kube.create(path_for(doc["apiVersion"], CHART_OBJECTS[doc["kind"]]), doc)
        for name, (devices, mode) in NODES.items():
            say(f"node {name}: kubelet (hollow node) + kubelet plugin ({devices}, MIG mode {mode})")
            nodes[name] = start_node(kube, name, devices, mode, st.kubeconfig, logs)
        for name in NODES:
            wait(
                f"slices of {name}",
                lambda n=name: kube.list(
                    path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={n}"
                )["items"],
            )
        for n in nodes.values():
            # Registration with the kubelet can trail the slices by a moment.
            with contextlib.suppress(TimeoutError):
                wait(f"{n.name}'s plugin ready", lambda n=n: n.readyz().endswith(" ready"), 20)
            say(f"{n.endpoints()} ({n.readyz()})")
        kube.create(path_for("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
        wait(
            "the demo namespace's ServiceAccount",
            lambda: _exists(kube, path_for("v1", "serviceaccounts", NAMESPACE, name="default")),
        )
        show_refusal()
        pods = apply_examples(kube)
        say(f"applied {len(pods)} example pods from examples/claims; waiting for them")
        try:
            wait(
                "the pods",
                lambda: all(
                    kube.get(path_for("v1", "pods", NAMESPACE, name=n))
                    .get("status", {})
                    .get("phase")
                    == "Running"
                    for n in pods
                ),
                timeout=45,
            )
        except TimeoutError:
            say("not every pod runs; the summary says why")
        print(summary(kube, pods, nodes))
        print(mig_layout(nodes))
        print()
        domains.show(
            kube,
            NAMESPACE,
            {n: nodes[n].root for n in domains.TRAYS},
            {n: nodes[n].state for n in domains.TRAYS},
            say,
        )
        gang.show(kube, st.kubeconfig, ns=NAMESPACE, trays=list(domains.TRAYS), say=say)
        show_sick_gpu(kube, nodes["h100-node"])
        show_integer_pod(kube)
        show_doctor(st.kubeconfig)
        say(f"done in {time.monotonic() - start:.0f}s")
        if args.keep:
            say(
                f"left running: export KUBECONFIG={st.kubeconfig}; "
                f"{STATE / 'kubectl'} get pods -n {NAMESPACE}; `make cluster-down` stops it "
                "(the node processes and the webhook too)"
            )
            for n in nodes.values():
                say(n.endpoints())
            say(f"every layer of every node: {doctor_command(st.kubeconfig)}")
            say(f"logs in {_shown(logs)} (until `make cluster-down` removes {_shown(STATE)})")
            _record_pids(nodes)
            return 0
    finally:
        if not args.keep:
            _release_claims(kube)
            for n in nodes.values():
                for proc in reversed(n.procs):
                    _stop(proc)
            cluster.down(STATE, remove=False)
            kept = _keep_logs(logs)
            cluster.down(STATE)
            say(f"logs of this run in {kept} ({_shown(STATE)} is removed; KEEP=1 keeps it all)")
    return 0


def _shown(path: Path | str) -> str:
    """A path as the user types it from the repository, where `make demo` runs."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)


def doctor_command(kubeconfig: str) -> str:
    """The command that checks every layer of every node of this cluster: doctor finds
    the nodes in the registry beside the kubeconfig (.devcluster/nodes/<node>.json)."""
    exe = Path(sys.executable).parent / "dradriver"
    return (
        f"{_shown(exe) if exe.exists() else 'dradriver'} doctor --kubeconfig {_shown(kubeconfig)}"
    )


def show_doctor(kubeconfig: str) -> None:
    """`dradriver doctor` as the user runs it: every layer of every node, bottom-up."""
    command = doctor_command(kubeconfig)
    say(f"every layer of every node, bottom-up: {command}")
    done = subprocess.run(
        [sys.executable, "-m", "dradriver.cli", "doctor", "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for line in (done.stdout + done.stderr).splitlines():
        print(f"  {line}", flush=True)
    if done.returncode != 0:
        say(f"doctor found a broken layer (exit {done.returncode}): the FAIL line says which")


def _keep_logs(logs: Path) -> str:
    """Copies the run's logs where they outlive .devcluster; the last run's replace the
    run before's."""
    try:
        shutil.rmtree(KEPT_LOGS, ignore_errors=True)
        shutil.copytree(logs, KEPT_LOGS)
    except OSError as exc:
        return f"nowhere: copying them to {_shown(KEPT_LOGS)} failed ({exc})"
    return _shown(KEPT_LOGS)


def show_sick_gpu(kube: Kube, node: NodeProcs) -> None:
    """A GPU no pod uses falls off the bus (`dradriver dev inject`): its devices are
    tainted in the node's slices at once, and the taints go after its reset and the
    plugin's probes."""
    from fakenvml import inject

    # Device names follow the GPU's UUID, not its NVML index: the index is an attribute.
    index: dict[str, int] = {}
    for s in kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={node.name}")[
        "items"
    ]:
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes", {})
            if "index" in attrs and "uuid" in attrs:
                index[attrs["uuid"]["string"]] = int(attrs["index"]["int"])
    used: set[int] = set()
    for c in kube.list(path_for(RES, "resourceclaims", NAMESPACE))["items"]:
        for r in (c.get("status", {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []:
            if r.get("pool") == node.name:
                f = device_facts(kube, node.name, r["device"])
                uuid = f.get("uuid") or f.get("parentUUID")
                if uuid in index:
                    used.add(index[uuid])
    free = [i for i in range(8) if i not in used]
    if not free:
        say(f"every GPU of {node.name} is in use: the sick-GPU step is left out")
        return
    gpu = free[-1]

    def tainted() -> set[str]:
        return {
            d["name"]
            for s in kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={node.name}"
            )["items"]
            for d in s["spec"].get("devices") or []
            if d.get("taints")
        }

    say(f"GPU {gpu} of {node.name} falls off the bus: dradriver dev inject --gpu {gpu} --xid 79")
    t0 = time.monotonic()
    inject.send(node.state, node.name, inject.Request(gpu, "xid", 79))
    bad = wait("the taints", tainted, timeout=15)
    say(
        f"  {len(bad)} devices of GPU {gpu} tainted gpu.dradriver.io/unhealthy=xid-79:"
        f"NoSchedule in {time.monotonic() - t0:.1f}s; new claims stay off them (a job "
        "that tolerates it still gets them: examples/claims/gpu-tolerating-unhealthy.yaml)"
    )
    t0 = time.monotonic()
    inject.send(node.state, node.name, inject.Request(gpu, "recover"))
    wait("the taints to go", lambda: not tainted(), timeout=30)
    say(f"  reset: healthy again after 3 clean probes, taints gone in {time.monotonic() - t0:.1f}s")


def show_integer_pod(kube: Kube) -> None:
    """examples/claims/nvidia-com-gpu-pod.yaml: a device-plugin pod, unchanged, gets one of
    our GPUs through the claim the scheduler makes for it."""
    (pod,) = yaml.safe_load_all(
        (REPO / "examples" / "claims" / "nvidia-com-gpu-pod.yaml").read_text()
    )
    name = pod["metadata"]["name"]
    say(f"pod {name} asks nvidia.com/gpu: 1 and no claim (examples/claims/nvidia-com-gpu-pod.yaml)")
    kube.create(path_for("v1", "pods", NAMESPACE), pod)

    def running() -> dict[str, Any] | None:
        got = kube.get(path_for("v1", "pods", NAMESPACE, name=name))
        return got if got.get("status", {}).get("phase") == "Running" else None

    try:
        got = wait(f"{name} to run", running, timeout=30)
    except TimeoutError:
        say(f"  {name} does not run: dradriver explain pod/{name} -n {NAMESPACE} says why")
        return
    claim = (got["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if not claim:
        say(
            f"  {name} runs on {got['spec'].get('nodeName')}, but names no claim of the scheduler's"
        )
        return
    c = kube.get(path_for(RES, "resourceclaims", NAMESPACE, name=claim))
    classes = {
        r["name"]: r.get("exactly", {}).get("deviceClassName")
        for r in c["spec"]["devices"]["requests"]
    }
    results = c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    got_devices = ", ".join(f"{r['pool']}/{r['device']}" for r in results)
    say(
        f"  Running: the scheduler made claim {claim} for it (request "
        + ", ".join(f"{r} of class {k}" for r, k in classes.items())
        + f") and allocated {got_devices}, which the kubelet prepared"
    )


def show_refusal() -> None:
    """`kubectl apply` of a claim whose config for the driver is wrong, as a user would
    type it: the admission webhook refuses it, naming the field, before it is stored."""
    manifest = STATE / "bad-config-claim.yaml"
    manifest.write_text(yaml.safe_dump(addons.bad_claim("bad-config"), sort_keys=False))
    shown = manifest.relative_to(REPO)
    say(
        "the admission webhook checks each claim's config for the driver at apply time; "
        f"one asking for sharing strategy {addons.BAD_STRATEGY!r}:"
    )
    print(f"  $ kubectl apply -n {NAMESPACE} -f {shown}", flush=True)
    applied = subprocess.run(
        [str(STATE / "kubectl"), "apply", "-n", NAMESPACE, "-f", str(shown)],
        cwd=REPO,
        env={**os.environ, "KUBECONFIG": str(STATE / "kubeconfig")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    print("  " + (applied.stderr or applied.stdout).strip(), flush=True)
    if applied.returncode == 0 or "denied the request" not in applied.stderr:
        raise RuntimeError("the admission webhook did not refuse a claim with a bad config")


def _release_claims(kube: Kube) -> None:
    """Deletes the demo's pods while the plugins still run, so every claim is unprepared
    (MIG devices destroyed, MPS daemons stopped) before the nodes go away."""
    try:
        kube.delete_collection(path_for("v1", "pods", NAMESPACE))
        wait(
            "the demo pods to be gone",
            lambda: not kube.list(path_for("v1", "pods", NAMESPACE))["items"],
            timeout=30,
        )
    except (KubeError, TimeoutError) as exc:
        say(f"cleanup: {exc}")


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
        return True
    except NotFound:
        return False


def _record_pids(nodes: dict[str, NodeProcs]) -> None:
    """Lets `make cluster-down` stop the node processes too."""
    state = cluster.ClusterState.load(STATE)
    if state is None:
        return
    for n in nodes.values():
        for i, proc in enumerate(n.procs):
            state.pids[f"{n.name}-{i}-{secrets.token_hex(2)}"] = proc.pid
    state.save()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
