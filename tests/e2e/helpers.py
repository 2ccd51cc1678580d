"""Helpers for end-to-end tests: waiting, and hollow nodes (the real kubelet) and the
plugin as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dradriver.k8s import Conflict, Kube, NotFound, path_for
from dradriver.k8s.lines import FEATURES, OLDEST, Line
from dradriver_dev.driver_files import plugin_env
from dradriver_dev.hollow_node import HOST_IMAGE as HOST_IMAGE
from dradriver_dev.hollow_node import host_processes, stop_host_processes
from dradriver_dev.ports import free_port
from tests.support import gpu_names

T = TypeVar("T")
RES = "resource.k8s.io/v1"
# Where a plugin run as a process puts its daemons' pods (--daemon-namespace's default).
DAEMON_NAMESPACE = "default"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: Path | None
    alpha: bool
    state_dir: Path | None
    # The Kubernetes line the control plane runs ($K8S; tests/README.md, "Lines").
    line: Line = OLDEST

    def has(self, gate: str) -> bool:
        """Whether the driver's feature behind `gate` is on here: turned on (alpha) or on
        by default on this line."""
        feature = next(f for f in FEATURES if f.gate == gate)
        return self.alpha or self.line.on_by_default(feature)


def wait_for(fn: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Polls fn until it returns something truthy; fails naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def get_or_none(kube: Kube, path: str) -> dict[str, Any] | None:
    try:
        return kube.get(path)
    except NotFound:
        return None


def allocated_health(pod: dict[str, Any] | None) -> list[str]:
    """A pod's status.containerStatuses[].allocatedResourcesStatus health values, as the
    kubelet writes them from a DRA plugin's health stream."""
    return [
        r.get("health", "")
        for cs in (pod or {}).get("status", {}).get("containerStatuses") or []
        for rs in cs.get("allocatedResourcesStatus") or []
        for r in rs.get("resources") or []
    ]


class DradriverProcess:
    """A `dradriver` command in its own process, logging to a file, as a user runs it."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path
    # A command it runs under, such as `unshare --pid --fork`: a PID namespace of its own,
    # as a container's (stop() then signals the wrapper, which passes SIGKILL on).
    prefix: tuple[str, ...] = ()

    def _spawn(self, args: list[str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "dradriver.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=self._env(),
            )

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


# The kubelet's log line (at -v=3) once its start-up wipe of the node's slices is done.
STARTUP_WIPE = '"Deleted ResourceSlices" logger="DRA registration handler.startup"'


# The kubelet's status manager when the API server refuses a pod's status (syncPod in
# pkg/kubelet/status/status_manager.go): the pod then never shows what its containers do
# (Q14b: a duplicate resourceID in allocatedResourcesStatus kept pods Pending).
REFUSED_STATUS = "Failed to update status for pod"
# What is no refusal: the pod deleted between the kubelet's read and its patch, or an API
# server a test stopped.
NOT_REFUSED = ("not found", "connection refused", "http2: client connection lost")
# Every hollow node's log, with how far it has been read for refused status patches, and
# what was found; conftest.py fails an e2e module that leaves any.
KUBELET_LOGS: dict[Path, int] = {}
REFUSED_PATCHES: list[str] = []


def read_refused_patches(path: Path) -> None:
    """Adds what the kubelet logged into `path` since the last read that is a refused
    status patch to REFUSED_PATCHES."""
    with contextlib.suppress(OSError), path.open("rb") as log:
        log.seek(KUBELET_LOGS.get(path, 0))
        for raw in log:
            line = raw.decode(errors="replace")
            if REFUSED_STATUS in line and not any(w in line for w in NOT_REFUSED):
                line = line.strip()  # the API server's reason is at its end
                short = line if len(line) < 700 else f"{line[:200]} ... {line[-450:]}"
                REFUSED_PATCHES.append(f"{path.name}: {short}")
        KUBELET_LOGS[path] = log.tell()


class HollowNode(DradriverProcess):
    """`dradriver dev kubelet`: the kubelet's own code ($K8S's line, or --kubernetes in
    extra_args) as a node, in its own process, as a developer runs it (see
    devtools/dradriver_dev/hollow_node.py for what its root holds)."""

    def __init__(
        self, kubeconfig: str, node: str, root: Path, *, extra_args: list[str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.node = node
        self.root = root
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root.parent / f"{node}.log"
        self.cdi_dir = root / "cdi"

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        KUBELET_LOGS.setdefault(
            self.log_path, self.log_path.stat().st_size if self.log_path.exists() else 0
        )
        self._spawn(
            [
                "dev",
                "kubelet",
                "--node",
                self.node,
                "--root",
                str(self.root),
                "--kubeconfig",
                self.kubeconfig,
                "--log-level",
                "debug",
                *self.extra_args,
            ]
        )

    def stop(self, sig: int = signal.SIGTERM, *, processes: bool = True) -> None:
        """Stops the kubelet; with `processes`, also what its runtime runs as host
        processes (the driver's daemon pods), as a node that goes away ends them."""
        super().stop(sig)
        read_refused_patches(self.log_path)  # before a test's tmp directory goes
        if processes:
            stop_host_processes(self.root)

    def host_processes(self) -> list[int]:
        """The PIDs of the containers its runtime runs as processes (the driver's daemon
        pods) that still run."""
        return [pid for pid, _ in host_processes(self.root)]

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """The kubelet stopped and started again; its containers run on, as containerd's do."""
        self.stop(sig, processes=False)
        self.start()

    def wait_node_ready(self, kube: Kube, timeout: float = 60) -> None:
        """Until the Node is Ready and the kubelet has wiped the node's slices, which it
        does once at start, in the background, as soon as it sees its own Node."""
        wipes = self.log().count(STARTUP_WIPE)

        def ready() -> bool:
            assert self.alive(), f"hollow node exited:\n{self.log()[-3000:]}"
            node = get_or_none(kube, path_for("v1", "nodes", name=self.node))
            conds = (node or {}).get("status", {}).get("conditions", [])
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            return ready and self.log().count(STARTUP_WIPE) > wipes

        wait_for(ready, f"node {self.node} Ready, its slices wiped", timeout)

    def container(self, pod_uid: str, name: str) -> dict[str, Any] | None:
        """What the runtime gave a running container (env, device nodes, mounts, hooks,
        CDI IDs), or None where it has not created it (or the pod is gone)."""
        p = self.root / "cri" / "pods" / pod_uid / f"{name}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    def claim_infos(self) -> list[dict[str, Any]]:
        """The kubelet's own DRA checkpoint (<root>/dra_manager_state): one entry per
        claim it holds, with the pods using it and the devices the driver returned."""
        try:
            outer = json.loads((self.root / "dra_manager_state").read_text())
        except (OSError, ValueError):
            return []
        return list(json.loads(outer["Data"]).get("ClaimInfoStateList") or [])


def publish_slice(
    kube: Kube, node: str, driver: str, devices: list[str], cleanup: Callable[[str], None]
) -> dict[str, Any]:
    name = f"{node}-{driver.split('.')[0]}"
    cleanup(path_for(RES, "resourceslices", name=name))
    return kube.create(
        path_for(RES, "resourceslices"),
        {
            "apiVersion": RES,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": d, "attributes": {"model": {"string": "smoke"}}} for d in devices
                ],
            },
        },
    )


def device_class(kube: Kube, driver: str, cleanup: Callable[[str], None]) -> str:
    name = f"smoke-{secrets.token_hex(3)}"
    cleanup(path_for(RES, "deviceclasses", name=name))
    kube.create(
        path_for(RES, "deviceclasses"),
        {
            "apiVersion": RES,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    return name


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


PLURALS = {
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "Pod": "pods",
    "DeviceClass": "deviceclasses",
    "ResourceSlice": "resourceslices",
}


def create_objects(
    kube: Kube,
    docs: list[dict[str, Any]],
    namespace: str | None = None,
    mutate: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Creates manifests as `kubectl create -f` would; cluster-scoped ones ignore `namespace`."""
    out = []
    for doc in docs:
        doc = json.loads(json.dumps(doc))
        if mutate:
            mutate(doc)
        plural = PLURALS[doc["kind"]]
        ns = namespace if doc["kind"] not in ("DeviceClass", "ResourceSlice") else None
        out.append(kube.create(path_for(doc["apiVersion"], plural, ns), doc))
    return out


def ensure_device_classes(kube: Kube) -> None:
    for doc in load_yaml(REPO / "deploy" / "deviceclasses.yaml"):
        with contextlib.suppress(Conflict):
            kube.create(path_for(doc["apiVersion"], "deviceclasses"), doc)


class PluginProc(DradriverProcess):
    """`dradriver kubelet-plugin` in its own process, pointed at a hollow node's kubelet."""

    def __init__(
        self,
        kubeconfig: str,
        kubelet: HollowNode,
        devices: str,
        mig_mode: str = "none",
        *,
        state_dir: Path | None = None,
        instance: str = "a",
        extra_args: list[str] | None = None,
    ) -> None:
        self.extra_args = extra_args or []
        self.kubeconfig, self.kubelet = kubeconfig, kubelet
        self.devices, self.mig_mode = devices, mig_mode
        self.state_dir = state_dir or kubelet.root.parent / f"{kubelet.node}-state"
        self.instance = instance
        self.port = free_port()
        self.log_path = kubelet.root.parent / f"{kubelet.node}-plugin-{instance}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(
            [
                "kubelet-plugin",
                "--node-name",
                self.kubelet.node,
                "--devices",
                self.devices,
                "--mig-mode",
                self.mig_mode,
                "--kubeconfig",
                self.kubeconfig,
                "--kubelet-dir",
                str(self.kubelet.root),
                "--cdi-dir",
                str(self.kubelet.cdi_dir),
                "--state-dir",
                str(self.state_dir),
                "--instance",
                self.instance,
                "--healthz-address",
                "127.0.0.1",
                "--healthz-port",
                str(self.port),
                "--log-level",
                "debug",
                # Its MPS and IMEX daemons as pods, which the hollow node runs as processes.
                "--daemon-image",
                HOST_IMAGE,
                # The fake GPUs' default driver is 570 (MPS v2): shares as the tests ask.
                "--mps-v2-shares",
                "allow",
                *self.extra_args,
            ]
        )

    def _env(self) -> dict[str, str]:
        # The driver's files in CDI (the plugin's default): NVIDIA's toolkit and a fake
        # driver root of the fake GPUs' version, unless a test sets DRADRIVER_DRIVER_ROOT.
        return plugin_env(super()._env(), self.devices)

    def http(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def ready(self) -> bool:
        assert self.alive(), f"plugin exited:\n{self.log()[-3000:]}"
        return self.http("/readyz")[0] == 200

    def metric(self, name: str, **labels: str) -> float:
        _, text = self.http("/metrics")
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = name + "{" + want if want else name + " "
        for line in text.splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def resource_path(kube: Kube, doc: dict[str, Any], namespace: str | None = None) -> str:
    """The REST path of a manifest's object, found through discovery as kubectl does, so
    any kind a chart renders can be applied and read back."""
    api_version, kind, name = doc["apiVersion"], doc["kind"], doc["metadata"]["name"]
    listing = kube.get("/api/v1" if api_version == "v1" else f"/apis/{api_version}")
    for r in listing["resources"]:
        if r["kind"] == kind and "/" not in r["name"]:
            ns = (doc["metadata"].get("namespace") or namespace) if r["namespaced"] else None
            return path_for(api_version, r["name"], ns, name=name)
    raise AssertionError(f"{api_version} {kind} is not served")


def apply_object(kube: Kube, doc: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """Server-side apply of one manifest, as `kubectl apply --server-side` does."""
    return kube.apply(resource_path(kube, doc, namespace), doc, field_manager="dradriver-e2e")


def request_token(kube: Kube, namespace: str, sa: str, pod: dict[str, Any] | None) -> str:
    """A TokenRequest for a ServiceAccount, bound to `pod` (the token then carries the pod's
    node name, as a kubelet-mounted token does) or unbound when pod is None."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
    tr = kube.create(
        path_for("v1", "serviceaccounts", namespace, name=sa, subresource="token"),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(tr["status"]["token"])


def token_kubeconfig(admin_kubeconfig: str, token: str, dest: Path) -> str:
    """A kubeconfig with the admin kubeconfig's server and CA and `token` as the user."""
    cfg = yaml.safe_load(Path(admin_kubeconfig).read_text())
    ctx = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"]
    cluster = next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    dest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    dest.chmod(0o600)
    return str(dest)


def new_namespace(kube: Kube, name: str) -> str:
    """Creates namespace `name` and returns it once it is ready for pods (its default
    ServiceAccount exists)."""
    kube.create(path_for("v1", "namespaces"), {"metadata": {"name": name}})
    wait_for(
        lambda: get_or_none(kube, path_for("v1", "serviceaccounts", name, name="default")),
        f"namespace {name}'s default ServiceAccount",
        30,
    )
    return name


class NodeUnderTest:
    """A hollow node with a running plugin, and the few things tests do with it."""

    def __init__(self, kube: Kube, ns: str, kubelet: HollowNode, plugin: PluginProc) -> None:
        self.kube, self.ns, self.kubelet, self.plugin = kube, ns, kubelet, plugin

    def daemon_pods(self, role: str = "") -> list[dict[str, Any]]:
        """The plugin's daemon pods on this node (MPS, IMEX: kubeletplugin/daemons/), as
        the API server holds them; `role`: "mps" or "imex" only."""
        selector = "app.kubernetes.io/managed-by=kubelet-plugin"
        if role:
            selector += f",app.kubernetes.io/component={role}-daemon"
        return list(
            self.kube.list(
                path_for("v1", "pods", DAEMON_NAMESPACE),
                labelSelector=selector,
                fieldSelector=f"spec.nodeName={self.kubelet.node}",
            )["items"]
        )

    def checkpoint_claims(self) -> dict[str, Any]:
        """The claims the plugin's checkpoint holds, by UID."""
        p = self.plugin.state_dir / "checkpoint.json"
        return dict(json.loads(p.read_text())["payload"]["claims"]) if p.exists() else {}

    def gpu_names(self) -> list[str]:
        """The node's whole-GPU device names by NVML index, as its plugin's discovery
        names them (from the fake's UUIDs for its spec and node)."""
        return gpu_names.fake_names(self.plugin.devices.removeprefix("fake:"), self.kubelet.node)

    def real(self, device: str) -> str:
        """This node's name for `device`, written by NVML index ("gpu-0-mig-3g40gb-4")."""
        return gpu_names.real(device, self.gpu_names())

    def apply(self, example: str, suffix: str = "", *, each_running: bool = False) -> list[str]:
        """Creates examples/claims/<example>.yaml pinned to this node; returns its pods.
        `each_running`: each pod once the one before it runs (shares of a GPU: made at
        once, the scheduler may try one while others' allocations are in flight, find
        no room and park it for minutes; see test_consumable.py)."""

        def pin(doc: dict[str, Any]) -> None:
            if suffix:
                doc["metadata"]["name"] += suffix
                for rc in doc.get("spec", {}).get("resourceClaims", []):
                    if "resourceClaimTemplateName" in rc:
                        rc["resourceClaimTemplateName"] += suffix
            if doc["kind"] == "Pod":
                doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.kubelet.node}

        pods = []
        for doc in load_yaml(REPO / "examples" / "claims" / f"{example}.yaml"):
            (made,) = create_objects(self.kube, [doc], self.ns, pin)
            if made["kind"] == "Pod":
                pods.append(str(made["metadata"]["name"]))
                if each_running:
                    self.running(pods[-1])
        return pods

    def claim_and_pod(
        self,
        name: str,
        selector: str,
        device_class: str = "mig.dradriver.io",
        request: str = "mig",
        *,
        capacity: dict[str, str] | None = None,
    ) -> None:
        """A claim for one device of `device_class` matching the CEL `selector` (asking
        `capacity` of it: a share), and a pod on this node (named like the claim) whose
        container uses it."""
        exactly: dict[str, Any] = {
            "deviceClassName": device_class,
            "selectors": [{"cel": {"expression": selector}}],
        }
        if capacity is not None:
            exactly["capacity"] = {"requests": capacity}
        self.kube.create(
            path_for(RES, "resourceclaims", self.ns),
            {
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
            },
        )
        self._pod_with(name, {"name": request, "resourceClaimName": name})

    def _pod_with(self, name: str, claim: dict[str, str]) -> None:
        """A pod on this node (named `name`) whose container uses the pod claim `claim`."""
        self.kube.create(
            path_for("v1", "pods", self.ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": self.kubelet.node},
                    "resourceClaims": [claim],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": claim["name"]}]},
                        }
                    ],
                },
            },
        )

    def template_and_pod(
        self, name: str, selector: str, device_class: str = "mig.dradriver.io", request: str = "mig"
    ) -> None:
        """claim_and_pod with the claim made from a ResourceClaimTemplate (named like the
        pod): the resourceclaim controller makes it and names it in the pod's status."""
        exactly = {
            "deviceClassName": device_class,
            "selectors": [{"cel": {"expression": selector}}],
        }
        self.kube.create(
            path_for(RES, "resourceclaimtemplates", self.ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}
                },
            },
        )
        self._pod_with(name, {"name": request, "resourceClaimTemplateName": name})

    def claim_of(self, pod: str) -> str:
        """The name of the claim a pod's template made (its status names it)."""
        got = get_or_none(self.kube, path_for("v1", "pods", self.ns, name=pod)) or {}
        (status,) = got.get("status", {}).get("resourceClaimStatuses") or [{}]
        return str(status["resourceClaimName"])

    def running(self, pod: str, timeout: float = 60) -> dict[str, Any]:
        path = path_for("v1", "pods", self.ns, name=pod)
        try:
            return wait_for(
                lambda: (
                    (p := get_or_none(self.kube, path))
                    and p.get("status", {}).get("phase") == "Running"
                    and p
                ),
                f"pod {pod} running",
                timeout,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.why_not_running(pod)}") from None

    def why_not_running(self, pod: str) -> str:
        """What a pod that did not start says about it: its conditions, its events and the
        plugin's last log lines (a flake is then diagnosed from the CI log alone)."""
        p = get_or_none(self.kube, path_for("v1", "pods", self.ns, name=pod)) or {}
        conditions = [
            f"{c.get('type')}={c.get('status')} {c.get('reason', '')} {c.get('message', '')}"
            for c in p.get("status", {}).get("conditions") or []
        ]
        events = [
            f"{e.get('reason')}: {e.get('message', '')}"
            for e in self.kube.list(path_for("v1", "events", self.ns))["items"]
            if e.get("involvedObject", {}).get("name") == pod
        ]
        return "\n".join(
            [
                f"pod {pod} on {p.get('spec', {}).get('nodeName')!r}:",
                *conditions,
                "events:",
                *events[-10:],
                "plugin log (last 4000 characters):",
                self.plugin.log()[-4000:],
            ]
        )

    def delete(self, *pods: str, timeout: float = 30) -> None:
        for p in pods:
            self.kube.delete(path_for("v1", "pods", self.ns, name=p), missing_ok=True)
        for p in pods:
            path = path_for("v1", "pods", self.ns, name=p)
            wait_for(
                lambda path=path: get_or_none(self.kube, path) is None, f"pod {p} gone", timeout
            )

    def record(self, pod: dict[str, Any], container: str = "main") -> dict[str, Any]:
        rec = self.kubelet.container(pod["metadata"]["uid"], container)
        assert rec is not None, f"no record for container {container}"
        return rec

    def env(self, pod: dict[str, Any], container: str = "main") -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.record(pod, container)["env"])


class HelmError(Exception):
    pass


def debian_package(name: str) -> Path:
    """Where Debian's package `name` (and what it needs here) is unpacked, fetched into the
    cache by tools/debian/fetch.sh the first time (`make prometheus chromium` does it)."""
    out = subprocess.run(
        ["bash", str(REPO / "tools" / "debian" / "fetch.sh"), name],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1])


def run_helm(helm: Path, *args: str, values: dict[str, Any] | None = None) -> str:
    """The helm CLI (the `helm` fixture's binary); raises HelmError with its stderr."""
    cmd = [str(helm), *args]
    if values is not None:
        cmd += ["--values", "-"]
    proc = subprocess.run(
        cmd, input=yaml.safe_dump(values or {}), capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip())
    return proc.stdout
