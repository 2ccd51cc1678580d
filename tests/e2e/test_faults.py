"""The catalogue of "why is my GPU pod Pending": each fault a new user met, injected on the
real control plane and a hollow node (the real kubelet), and `dradriver explain` or
`dradriver doctor` naming its layer and its fix in one line."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.commands import dev_nodes
from dradriver.k8s import Kube, KubeError, path_for

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    PluginProc,
    ensure_device_classes,
    free_port,
    get_or_none,
    request_token,
    token_kubeconfig,
    wait_for,
)
from .test_webhook import refused_by_webhook, running_controller

pytestmark = pytest.mark.e2e
D = "gpu.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"


@dataclass
class Faulty:
    """One hollow node with the plugin on two fake H100s, shared by the catalogue's tests
    (each puts back what it broke)."""

    kube: Kube
    cluster: Cluster
    ns: str
    kubelet: HollowNode
    plugin: PluginProc
    tmp: Path

    def claim(
        self, name: str, selector: str = "", count: int = 1, cls: str = D, config: Any = None
    ) -> None:
        exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
        if config is not None:
            devices["config"] = [
                {"requests": ["gpu"], "opaque": {"driver": D, "parameters": config}}
            ]
        self.kube.create(
            path_for(RES, "resourceclaims", self.ns),
            {"metadata": {"name": name}, "spec": {"devices": devices}},
        )

    def pod(self, name: str, claim: str, **spec: Any) -> None:
        self.kube.create(
            path_for("v1", "pods", self.ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": self.kubelet.node},
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                    "containers": [
                        {"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                    **spec,
                },
            },
        )

    def phase(self, pod: str) -> str:
        p = get_or_none(self.kube, path_for("v1", "pods", self.ns, name=pod))
        return str((p or {}).get("status", {}).get("phase", ""))

    def unschedulable(self, pod: str) -> bool:
        p = get_or_none(self.kube, path_for("v1", "pods", self.ns, name=pod)) or {}
        return any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in p.get("status", {}).get("conditions") or []
        )

    def doctor(self, *extra: str, **flags: str) -> tuple[int, list[str]]:
        args = {
            "node": self.kubelet.node,
            "kubeconfig": self.cluster.kubeconfig,
            "devices": "fake:2xH100-80GB",
            "state-dir": str(self.plugin.state_dir),
            "cdi-dir": str(self.kubelet.cdi_dir),
            "readyz": f"http://127.0.0.1:{self.plugin.port}/readyz",
            "containerd-config": str(self.tmp / "no-containerd.toml"),
            **flags,
        }
        argv = ["doctor"] + [x for k, v in args.items() if v for x in (f"--{k}", v)]
        return _run([*argv, *extra])

    def explain(self, target: str, kubeconfig: str | None = None) -> tuple[int, list[str]]:
        kubeconfig = kubeconfig or self.cluster.kubeconfig
        return _run(["explain", target, "-n", self.ns, "--kubeconfig", kubeconfig])

    def delete_pods(self, *pods: str) -> None:
        """Pods left Pending would take the GPUs once the fault is put right."""
        for p in pods:
            self.kube.delete(path_for("v1", "pods", self.ns, name=p), missing_ok=True)
        for p in pods:
            path = path_for("v1", "pods", self.ns, name=p)
            wait_for(lambda path=path: get_or_none(self.kube, path) is None, f"pod {p} gone", 30)


def _run(argv: list[str]) -> tuple[int, list[str]]:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        rc = main(argv)
    return rc, out.getvalue().splitlines()


def verdict(lines: list[str]) -> str:
    """explain's one-line answer."""
    (line,) = [x for x in lines if x.startswith("=> ")]
    return line[3:]


def layer(lines: list[str], name: str) -> str:
    """doctor's line for the layer `name`."""
    (line,) = [x for x in lines if x.split()[1:2] == [f"{name}:"]]
    return line


def failing(lines: list[str]) -> str:
    """doctor's first broken layer, in one line."""
    bad = [x for x in lines if x.startswith("FAIL")]
    assert bad, "doctor found nothing wrong:\n" + "\n".join(lines)
    return bad[0]


@pytest.fixture(scope="module")
def faulty(cluster: Cluster) -> Iterator[Faulty]:
    kube = Kube.from_kubeconfig(cluster.kubeconfig)
    ensure_device_classes(kube)
    ns = f"faults-{secrets.token_hex(3)}"
    kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    tmp = Path(tempfile.mkdtemp(prefix="drf-"))
    node = f"faulty-{secrets.token_hex(3)}"
    kubelet = HollowNode(cluster.kubeconfig, node, tmp / node)
    kubelet.start()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:2xH100-80GB")
    try:
        kubelet.wait_node_ready(kube)
        plugin.start()
        wait_for(plugin.ready, "the plugin to be ready", 30)
        wait_for(
            lambda: get_or_none(kube, path_for("v1", "serviceaccounts", ns, name="default")),
            "the namespace's ServiceAccount",
            30,
        )
        yield Faulty(kube, cluster, ns, kubelet, plugin, tmp)
    finally:
        plugin.stop()
        kubelet.stop()
        with contextlib.suppress(KubeError):
            kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)
            kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)
        kube.close()
        shutil.rmtree(tmp, ignore_errors=True)


def healthy(line: str, cluster: Cluster) -> bool:
    """A layer of a healthy node: ok (or skipped), or, on a line that has the driver's
    features off by default and a cluster that did not turn them on, the feature
    layer's warning naming them."""
    state, layer = line.split()[:2]
    lacking = bool(cluster.line.gates_to_turn_on()) and not cluster.alpha
    return state in ("ok", "skip") or (lacking and (state, layer) == ("warn", "feature-gates:"))


def test_a_healthy_node_is_ok_on_every_layer(faulty: Faulty) -> None:
    rc, lines = faulty.doctor()
    layers = [x.split()[1].rstrip(":") for x in lines]
    assert layers == [
        "nvml", "cdi", "driver-files", "api-server", "plugin", "slices", "node", "deviceclasses",
        "feature-gates",
    ], lines  # fmt: skip
    assert rc == 0 and all(healthy(x, faulty.cluster) for x in lines), lines
    assert lines[0] == "ok    nvml: driver 570.86.15, CUDA 12.8.0, 2 GPUs (fake devices)"
    # The cluster's line and what it lacks of the driver's features, with the fix.
    gates = lines[-1]
    assert f"Kubernetes {faulty.cluster.line.name}" in gates, gates
    if faulty.cluster.line.gates_to_turn_on():
        assert "DRADeviceTaints (health taints" in gates and "Fix: --feature-gates" in gates
    else:
        assert gates.startswith("ok    feature-gates:") and "every DRA feature" in gates


# --- the node's layers: doctor ---


def test_driver_missing(faulty: Faulty) -> None:
    rc, lines = faulty.doctor(devices="nvml")
    assert rc == 1 and len(lines) == 1
    assert lines[0].startswith("FAIL  nvml: NVML does not answer:")
    assert "libnvidia-ml.so.1" in lines[0] and "Fix: install the NVIDIA driver" in lines[0]


def test_cdi_dir_unwritable(faulty: Faulty) -> None:
    # sysfs takes no new files, not even from root (CI runs as root: mode bits would not do).
    rc, lines = faulty.doctor(**{"cdi-dir": "/sys/kernel"})
    assert rc == 1
    assert failing(lines).startswith("FAIL  cdi: /sys/kernel is not writable:")
    assert "Fix: mount the CDI directory read-write" in failing(lines)


def test_runtime_cdi_off(faulty: Faulty) -> None:
    conf = faulty.tmp / "containerd.toml"
    conf.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = false\n')
    rc, lines = faulty.doctor(**{"containerd-config": str(conf)})
    assert rc == 1
    assert failing(lines).startswith(f"FAIL  cdi: {conf}: CDI is off in containerd")
    assert "Fix: set enable_cdi = true" in failing(lines)


def test_plugin_not_running(faulty: Faulty) -> None:
    url = f"http://127.0.0.1:{free_port()}/readyz"
    rc, lines = faulty.doctor(readyz=url)
    assert rc == 1
    assert failing(lines).startswith(f"FAIL  plugin: the kubelet plugin does not answer at {url}")
    assert "Fix: check the plugin pod on this node" in failing(lines)


def test_wrong_kubelet_dir(faulty: Faulty) -> None:
    """A plugin whose sockets are where the kubelet does not look is never registered."""
    elsewhere = HollowNode(faulty.cluster.kubeconfig, faulty.kubelet.node, faulty.tmp / "wrong")
    plugin = PluginProc(
        faulty.cluster.kubeconfig, elsewhere, "fake:1xL4", state_dir=faulty.tmp / "wrong-state"
    )
    plugin.start()
    try:
        readyz = f"http://127.0.0.1:{plugin.port}/readyz"

        def started() -> bool:
            # Up but for the registration: the checkpoint is loaded a moment after the
            # first slice, and doctor names a startup still under way first.
            code, body = plugin.http("/readyz")
            return code == 503 and json.loads(body)["checkpoint"]["ok"]

        wait_for(started, "the plugin started, but for its registration", 20)
        rc, lines = faulty.doctor(
            readyz=readyz, devices="fake:1xL4", **{"state-dir": str(plugin.state_dir)}
        )
        assert rc == 1
        line = failing(lines)
        assert line.startswith("FAIL  plugin: /readyz registration: waiting for the kubelet")
        assert "--kubelet-dir (Helm kubeletDir)" in line
    finally:
        plugin.stop()


def test_socket_deleted(faulty: Faulty) -> None:
    (sock,) = list((faulty.kubelet.plugins_dir / D).glob("dra*.sock"))
    sock.unlink()
    wait_for(sock.exists, "the DRA socket to come back", 10)
    rc, lines = faulty.doctor()
    assert rc == 0 and "ok    plugin: running and registered with the kubelet" in layer(
        lines, "plugin"
    )


def test_slices_deleted(faulty: Faulty) -> None:
    for s in faulty.kube.list(path_for(RES, "resourceslices")).get("items", []):
        if s["spec"].get("nodeName") == faulty.kubelet.node:
            faulty.kube.delete(path_for(RES, "resourceslices", name=s["metadata"]["name"]))
    # The plugin watches its slices and puts them back within seconds.
    wait_for(lambda: faulty.doctor()[0] == 0, "doctor ok again (slices republished)", 15)
    assert layer(faulty.doctor()[1], "slices").startswith(
        "ok    slices: 1 slice, 2 devices published"
    )


def test_node_cordoned(faulty: Faulty) -> None:
    node = path_for("v1", "nodes", name=faulty.kubelet.node)
    faulty.kube.patch(node, {"spec": {"unschedulable": True}})
    try:
        rc, lines = faulty.doctor()
        assert rc == 1
        assert failing(lines) == (
            "FAIL  node: cordoned: no new pods are scheduled here. "
            f"Fix: kubectl uncordon {faulty.kubelet.node}"
        )
        faulty.claim("cordon")
        faulty.pod("cordon", "cordon")
        wait_for(lambda: faulty.unschedulable("cordon"), "the scheduler to give up", 20)
        rc, lines = faulty.explain("cordon")
        assert rc == 1
        assert verdict(lines).startswith("node: only nodes the pod may not use have the devices")
        assert f"{faulty.kubelet.node}: cordoned" in verdict(lines)
        assert "Fix: uncordon the node" in verdict(lines)
    finally:
        faulty.delete_pods("cordon")
        faulty.kube.patch(node, {"spec": {"unschedulable": None}})


def test_node_tainted(faulty: Faulty) -> None:
    node = path_for("v1", "nodes", name=faulty.kubelet.node)
    taint = {"key": "example.com/maintenance", "value": "yes", "effect": "NoSchedule"}
    faulty.kube.patch(node, {"spec": {"taints": [taint]}})
    try:
        faulty.claim("taint")
        faulty.pod("taint", "taint")
        wait_for(lambda: faulty.unschedulable("taint"), "the scheduler to give up", 20)
        rc, lines = faulty.explain("pod/taint")
        assert rc == 1
        assert "taint example.com/maintenance=yes:NoSchedule not tolerated" in verdict(lines)
        assert "add a toleration for its taint to the pod" in verdict(lines)
        rc, lines = faulty.doctor()
        assert rc == 0 and any(x.startswith("warn  node: tainted") for x in lines)
    finally:
        faulty.delete_pods("taint")
        faulty.kube.patch(node, {"spec": {"taints": None}})


def test_kubelet_restart(faulty: Faulty) -> None:
    faulty.kubelet.restart()
    faulty.kubelet.wait_node_ready(faulty.kube)
    wait_for(lambda: faulty.doctor()[0] == 0, "doctor ok again after the kubelet restart", 30)


def test_api_server_down(faulty: Faulty) -> None:
    doc = yaml.safe_load(Path(faulty.cluster.kubeconfig).read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = faulty.tmp / "dead-kubeconfig"
    dead.write_text(yaml.safe_dump(doc))
    rc, lines = faulty.doctor(kubeconfig=str(dead))
    assert rc == 1 and failing(lines).startswith("FAIL  api-server: api-server: cannot reach")
    assert "Fix: check that the API server runs" in failing(lines)
    rc, lines = faulty.explain("anything", kubeconfig=str(dead))
    assert rc == 2 and lines[-1].startswith("api-server: cannot reach https://127.0.0.1:")


def test_missing_kubeconfig_is_one_line(faulty: Faulty) -> None:
    rc, lines = faulty.explain("anything", kubeconfig=str(faulty.tmp / "nope"))
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kubeconfig: cannot load")


# --- scheduling: explain ---


def test_selector_matches_nothing(faulty: Faulty) -> None:
    """An "80GB" H100 has 79.6 GiB: the classic selector that matches no device."""
    faulty.claim("mem80", f'device.capacity["{D}"].memory.compareTo(quantity("80Gi")) >= 0')
    faulty.pod("mem80", "mem80")
    wait_for(lambda: faulty.unschedulable("mem80"), "the scheduler to give up", 20)
    rc, lines = faulty.explain("mem80")
    v = verdict(lines)
    assert rc == 1 and v.startswith("selector: 0 of ") and f"devices of class {D} match" in v
    assert f"the largest {D}/memory is 79.6Gi (NVIDIA H100 80GB HBM3)" in v
    assert "Fix: relax the request's selector" in v
    # The per-node table counts this node's two GPUs.
    (row,) = [x for x in lines if x.strip().startswith(faulty.kubelet.node)]
    assert row.split()[1:7] == ["2", "2", "0", "0", "0", "0"]


def test_missing_attribute(faulty: Faulty) -> None:
    faulty.claim("attr", f'device.attributes["{D}"].memoryGB >= 80')
    faulty.pod("attr", "attr")
    wait_for(lambda: faulty.unschedulable("attr"), "the scheduler to give up", 20)
    rc, lines = faulty.explain("attr")
    v = verdict(lines)
    assert rc == 1 and v.startswith("selector: request gpu selector #0 fails with a CEL runtime")
    assert "memoryGB" in v and "Fix: guard attributes some devices lack with has(" in v


def test_too_many_gpus(faulty: Faulty) -> None:
    faulty.claim("many", f'device.attributes["{D}"].productName.startsWith("NVIDIA H100")', 3)
    rc, lines = faulty.explain("claim/many")
    v = verdict(lines)
    assert rc == 1 and v.startswith("capacity: request gpu asks for 3 devices")
    assert "Fix: ask for fewer devices per claim" in v


def test_capacity_exhausted(faulty: Faulty) -> None:
    faulty.claim("both", count=2)
    faulty.pod("both", "both")
    wait_for(lambda: faulty.phase("both") == "Running", "the pod holding both GPUs", 60)
    faulty.claim("third")
    faulty.pod("third", "third")
    try:
        wait_for(lambda: faulty.unschedulable("third"), "the scheduler to give up", 20)
        rc, lines = faulty.explain("third")
        v = verdict(lines)
        assert rc == 1 and v.startswith("allocation: all ")
        assert f"{faulty.ns}/both (2)" in v and "Fix: wait for those claims to be released" in v
    finally:
        faulty.delete_pods("both", "third")


def test_typod_device_class(faulty: Faulty) -> None:
    faulty.claim("typo", cls="gpu.dradriver.oi")
    rc, lines = faulty.explain("claim/typo")
    v = verdict(lines)
    assert rc == 1 and v.startswith("deviceclass: request gpu names DeviceClass gpu.dradriver.oi")
    assert f"did you mean {D}?" in v and "Fix: correct deviceClassName" in v


def test_no_slices_from_the_driver(faulty: Faulty) -> None:
    """A DeviceClass for a driver no node runs: the node publishes nothing for it."""
    name = f"other-{secrets.token_hex(3)}.example.com"
    faulty.kube.create(
        path_for(RES, "deviceclasses"),
        {
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]},
        },
    )
    try:
        faulty.claim("other", cls=name)
        rc, lines = faulty.explain("claim/other")
        v = verdict(lines)
        assert rc == 1 and v.startswith(f"slices: no ResourceSlices from driver {name} on any node")
        assert "Fix: check that the kubelet plugin of that driver runs" in v
    finally:
        faulty.kube.delete(path_for(RES, "deviceclasses", name=name), missing_ok=True)


def test_bad_config_without_webhook(faulty: Faulty) -> None:
    """No admission webhook: the API server stores a config the driver refuses, the pod
    is scheduled, and the kubelet's prepare fails with the driver's reason."""
    bad = {
        "apiVersion": f"{D}/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Sometimes"},
    }
    faulty.claim("badcfg", config=bad)
    faulty.pod("badcfg", "badcfg")

    def said() -> str | None:
        _, lines = faulty.explain("badcfg")
        v = verdict(lines)
        return v if v.startswith("prepare:") else None

    v = wait_for(said, "explain to name the failed prepare", 60, interval=1)
    assert "could not prepare its devices" in v and "Sometimes" in v
    assert "install the admission webhook" in v
    faulty.delete_pods("badcfg")


def test_dynamic_mig_with_the_gate_off(cluster: Cluster, faulty: Faulty) -> None:
    """The GA cluster has DRAPartitionableDevices off: a plugin in dynamic MIG mode
    refuses to publish partitions, and both tools name the gate."""
    if cluster.has("DRAPartitionableDevices"):
        pytest.skip(f"DRAPartitionableDevices is on by default on {cluster.line.name}")
    kubelet = HollowNode(cluster.kubeconfig, f"nogate-{secrets.token_hex(3)}", faulty.tmp / "ng")
    kubelet.start()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:1xH100-80GB", "dynamic")
    try:
        kubelet.wait_node_ready(faulty.kube)
        plugin.start()

        def gate_named() -> list[str] | None:
            rc, lines = faulty.doctor(
                node=kubelet.node,
                devices="fake:1xH100-80GB",
                **{
                    "state-dir": str(plugin.state_dir),
                    "cdi-dir": str(kubelet.cdi_dir),
                    "readyz": f"http://127.0.0.1:{plugin.port}/readyz",
                    "mig-mode": "dynamic",
                },
            )
            return lines if rc == 1 and "DRAPartitionableDevices" in failing(lines) else None

        lines = wait_for(gate_named, "doctor to name the gate", 30, interval=1)
        assert "Fix:" in failing(lines) or "enable it" in failing(lines)
        faulty.claim("mig", cls="mig.dradriver.io")
        rc, lines = faulty.explain("claim/mig")
        v = verdict(lines)
        assert rc == 1 and v.startswith("feature-gate: no MIG devices are published")
        assert "Fix: enable DRAPartitionableDevices on kube-apiserver" in v
    finally:
        plugin.stop()
        kubelet.stop()
        with contextlib.suppress(KubeError):
            faulty.kube.delete(path_for("v1", "nodes", name=kubelet.node), missing_ok=True)


# --- /readyz from its first answer, and the fix for what refused the plugin: doctor ---


def test_a_plugin_just_started_answers_ready_and_doctor_passes_at_once(faulty: Faulty) -> None:
    """The API probe runs from startup: the first /readyz after a start is the truth,
    not "api: not checked yet" (which doctor took for an unreachable API server)."""
    faulty.plugin.stop()
    faulty.plugin.start()
    # Waited for without asking /readyz: its first answer is what this test is about.
    wait_for(
        lambda: faulty.plugin.alive() and faulty.plugin.metric("dradriver_registered") == 1,
        "the restarted plugin registered with the kubelet",
        30,
    )
    code, body = faulty.plugin.http("/readyz")
    assert code == 200, body
    assert json.loads(body)["api"] == {"ok": True, "detail": faulty.kube.host}
    rc, lines = faulty.doctor()
    assert rc == 0, lines
    assert (
        layer(lines, "plugin")
        == "ok    plugin: running and registered with the kubelet (/readyz ok)"
    )


def _refusing_kubeconfig(faulty: Faulty, what: str) -> str:
    """A kubeconfig for the plugin that the API server refuses in the way `what` says."""
    dest = faulty.tmp / f"{what}-kubeconfig"
    if what == "credentials":  # a token the API server never issued
        return token_kubeconfig(faulty.cluster.kubeconfig, "not-a-token", dest)
    if what == "rbac":  # a real ServiceAccount no ClusterRole is bound to
        token = request_token(faulty.kube, faulty.ns, "default", None)
        return token_kubeconfig(faulty.cluster.kubeconfig, token, dest)
    doc = yaml.safe_load(Path(faulty.cluster.kubeconfig).read_text())
    for c in doc["clusters"]:  # nothing listens there
        c["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dest.write_text(yaml.safe_dump(doc))
    return str(dest)


@pytest.mark.parametrize(
    ("what", "said", "fix"),
    [
        (
            "credentials",
            "refused the plugin's credentials (401 Unauthorized",
            "Fix: the API server rejects the plugin's credentials: check its ServiceAccount token",
        ),
        (
            "rbac",
            "forbids the plugin's identity to list its slices (403 Forbidden",
            "Fix: the plugin's identity lacks RBAC: check the ClusterRole and ClusterRoleBinding",
        ),
        (
            "address",
            "cannot reach the API server at https://127.0.0.1:",
            "Fix: the plugin cannot reach the API server: check the network from the node",
        ),
    ],
    ids=["credentials", "rbac", "address"],
)
def test_a_plugin_the_api_server_refuses_gets_the_fix_for_what_refused_it(
    faulty: Faulty, what: str, said: str, fix: str
) -> None:
    node = f"refused-{secrets.token_hex(3)}"
    nowhere = HollowNode(faulty.cluster.kubeconfig, node, faulty.tmp / node)  # never started
    plugin = PluginProc(
        _refusing_kubeconfig(faulty, what),
        nowhere,
        "fake:1xL4",
        state_dir=faulty.tmp / f"{node}-state",
    )
    plugin.start()
    try:
        wait_for(lambda: plugin.alive() and plugin.http("/readyz")[0], "the plugin's /readyz", 20)
        rc, lines = faulty.doctor(
            node=node,
            readyz=f"http://127.0.0.1:{plugin.port}/readyz",
            devices="fake:1xL4",
            **{"state-dir": str(plugin.state_dir)},
        )
        assert rc == 1
        line = failing(lines)
        assert line.startswith("FAIL  plugin: /readyz api: "), line
        assert said in line and fix in line, line
    finally:
        plugin.stop()


# --- a dev cluster (make demo KEEP=1): doctor finds each node's plugin itself ---


@dataclass
class DevCluster:
    """The catalogue's node and a second one, registered as the dev tooling registers
    the demo's, beside a kubeconfig of their own."""

    kubeconfig: str
    second: PluginProc


def _register(where: Path, plugin: PluginProc) -> None:
    dev_nodes.write(
        where,
        dev_nodes.DevNode(
            node=plugin.kubelet.node,
            readyz=f"http://127.0.0.1:{plugin.port}/readyz",
            devices=plugin.devices,
            mig_mode=plugin.mig_mode,
            cdi_dir=str(plugin.kubelet.cdi_dir),
            state_dir=str(plugin.state_dir),
            kubelet_dir=str(plugin.kubelet.root),
            plugin_log=str(plugin.log_path),
        ),
    )


@pytest.fixture(scope="module")
def dev_cluster(faulty: Faulty) -> Iterator[DevCluster]:
    where = faulty.tmp / "devcluster"
    where.mkdir()
    kubeconfig = where / "kubeconfig"
    shutil.copy(faulty.cluster.kubeconfig, kubeconfig)
    kubelet = HollowNode(faulty.cluster.kubeconfig, f"dev-{secrets.token_hex(3)}", where / "n")
    kubelet.start()
    plugin = PluginProc(faulty.cluster.kubeconfig, kubelet, "fake:1xL4")
    try:
        kubelet.wait_node_ready(faulty.kube)
        # Ready comes first; the node lifecycle controller lifts the not-ready taint a
        # moment later, and doctor's node layer (rightly) fails while it is there.
        node_path = path_for("v1", "nodes", name=kubelet.node)
        wait_for(
            lambda: (
                not any(
                    t["key"].startswith("node.kubernetes.io/")
                    for t in faulty.kube.get(node_path).get("spec", {}).get("taints", [])
                )
            ),
            "the node lifecycle controller to lift the not-ready taint",
            60,
        )
        plugin.start()
        wait_for(plugin.ready, "the second node's plugin to be ready", 30)
        _register(where, faulty.plugin)
        _register(where, plugin)
        yield DevCluster(str(kubeconfig), plugin)
    finally:
        plugin.stop()
        kubelet.stop()
        with contextlib.suppress(KubeError):
            faulty.kube.delete(path_for("v1", "nodes", name=kubelet.node), missing_ok=True)


def _bare_doctor(dev: DevCluster, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    """`dradriver doctor`, no flags, with the dev cluster's kubeconfig exported."""
    monkeypatch.setenv("KUBECONFIG", dev.kubeconfig)
    for var in ("NODE_NAME", "DRADRIVER_NODE_NAME", "DRADRIVER_DEVICES", "DRADRIVER_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    return _run(["doctor"])


def _by_node(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for x in lines[:-1]:
        if x.startswith("node "):
            out[x.split()[1]] = []
        else:
            out[list(out)[-1]].append(x)
    return out


def test_doctor_with_no_flags_checks_every_layer_of_every_dev_node(
    faulty: Faulty, dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, lines = _bare_doctor(dev_cluster, monkeypatch)
    assert rc == 0, lines
    nodes = _by_node(lines)
    assert sorted(nodes) == sorted([faulty.kubelet.node, dev_cluster.second.kubelet.node])
    for node, layers in nodes.items():
        named = [x.split()[1].rstrip(":") for x in layers]
        assert named == [
            "nvml", "cdi", "driver-files", "api-server", "plugin", "slices", "node",
            "deviceclasses", "feature-gates",
        ], (node, layers)  # fmt: skip
        assert all(healthy(x, faulty.cluster) for x in layers), layers
        # Found on the node itself, from the registry: NVML, the CDI directory, /readyz.
        assert layers[0].startswith("ok    nvml: driver 570.86.15"), layers
        assert layers[1].endswith(
            "writable; the hollow node's runtime resolves CDI devices from it"
        )
    assert nodes[dev_cluster.second.kubelet.node][0].endswith("1 GPU (fake devices)")
    assert lines[-1] == "2 dev nodes checked: every layer of each is ok"


def test_doctor_in_a_dev_cluster_names_the_node_whose_plugin_stopped(
    faulty: Faulty, dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = dev_cluster.second
    second.stop()
    try:
        rc, lines = _bare_doctor(dev_cluster, monkeypatch)
        assert rc == 1
        nodes = _by_node(lines)
        assert all(healthy(x, faulty.cluster) for x in nodes[faulty.kubelet.node]), lines
        line = failing(nodes[second.kubelet.node])
        url = f"http://127.0.0.1:{second.port}/readyz"
        assert line.startswith(f"FAIL  plugin: the kubelet plugin does not answer at {url}")
        fix = "Fix: start the dev node's plugin again (make demo KEEP=1); why it stopped is in"
        assert f"{fix} {second.log_path}" in line, line
        assert lines[-1].startswith(
            f"2 dev nodes checked: 1 broken: {second.kubelet.node} (plugin)"
        )
    finally:
        second.start()
        wait_for(second.ready, "the second node's plugin ready again", 30)


# --- configs and selectors the user got wrong: where the refusal is, and the nearest name ---

V = f"{D}/v1alpha1"
# The typo: the field is defaultActiveThreadPercentage.
TYPO_FIELD = {
    "apiVersion": V,
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercent": 50}},
}
TYPO_REFUSAL = (
    "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercent: "
    "unknown field; did you mean defaultActiveThreadPercentage? (allowed here: "
    "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
    "defaultPerDevicePinnedMemoryLimit)"
)


@contextlib.contextmanager
def _own_namespace(faulty: Faulty) -> Iterator[Faulty]:
    """The catalogue's node with a namespace of its own, so that a webhook configured for
    it never refuses what the other entries create in theirs."""
    ns = f"guarded-{secrets.token_hex(3)}"
    faulty.kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    try:
        wait_for(
            lambda: get_or_none(faulty.kube, path_for("v1", "serviceaccounts", ns, name="default")),
            "the namespace's ServiceAccount",
            30,
        )
        yield replace(faulty, ns=ns)
    finally:
        with contextlib.suppress(KubeError):
            faulty.kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


@contextlib.contextmanager
def _webhook(f: Faulty) -> Iterator[None]:
    """dradriver's admission webhook, in effect for f's namespace only."""
    tmp = Path(tempfile.mkdtemp(prefix="drw-"))
    try:
        with running_controller(f.cluster, f.kube, f.ns, tmp):
            wait_for(lambda: refused_by_webhook(f.kube, f.ns), "the webhook in effect", 30)
            yield
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pod_events(f: Faulty, pod: str) -> list[dict[str, Any]]:
    return list(
        f.kube.list(
            path_for("v1", "events", f.ns),
            fieldSelector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
        ).get("items", [])
    )


def test_a_claim_the_webhook_refused_at_apply_time(faulty: Faulty) -> None:
    """The claim never existed: the pod sits Pending with no events, and explain says the
    webhook may have refused it and where that refusal is shown."""
    with _own_namespace(faulty) as f, _webhook(f):
        with pytest.raises(KubeError) as refused:
            f.claim("bad-mps", config=TYPO_FIELD)
        # What `kubectl apply` prints: the field, the allowed names and the nearest.
        assert refused.value.message.endswith(f'ResourceClaim "bad-mps": {TYPO_REFUSAL}')
        f.pod("trial", "bad-mps")
        rc, lines = f.explain("trial")
        v = verdict(lines)
        assert rc == 1 and v.startswith(
            f"admission: ResourceClaim {f.ns}/bad-mps (claim gpu of the pod) does not exist; "
            "it may have been refused when it was applied: the admission webhook "
            "claims.gpu.dradriver.io (ValidatingWebhookConfiguration dradriver-e2e-"
        ), v
        assert "one it refuses leaves no object and no event" in v
        assert (
            "Fix: apply the ResourceClaim's manifest again to see the refusal (`kubectl apply "
            "--dry-run=server -f FILE` shows it without creating anything)"
        ) in v
        # Nothing else on the cluster says why: no event on the pod names the claim.
        assert not [e for e in _pod_events(f, "trial") if "bad-mps" in str(e.get("message"))]


def test_a_claim_from_a_template_the_webhook_refuses(faulty: Faulty) -> None:
    """A template stored before the webhook checked it: each claim the resourceclaim
    controller makes from it is refused, and kube-controller-manager says so in a
    FailedResourceClaimCreation event on the pod, which explain quotes."""
    with _own_namespace(faulty) as f:
        devices = {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": D}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": D, "parameters": TYPO_FIELD}}],
        }
        f.kube.create(
            path_for(RES, "resourceclaimtemplates", f.ns),
            {"metadata": {"name": "mps"}, "spec": {"spec": {"devices": devices}}},
        )
        with _webhook(f):
            f.pod("trial", "", resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "mps"}])

            def refusal() -> dict[str, Any] | None:
                failed = [
                    e
                    for e in _pod_events(f, "trial")
                    if e.get("reason") == "FailedResourceClaimCreation"
                ]
                return failed[0] if failed else None

            event = wait_for(refusal, "the controller's event on the pod", 60, interval=1)
            assert event is not None and event["type"] == "Warning"
            assert event["message"].startswith("PodResourceClaim gpu: create ResourceClaim")
            rc, lines = f.explain("trial")
            v = verdict(lines)
            assert rc == 1 and v.startswith(
                "admission: the resourceclaim controller could not create the pod's claim gpu "
                f"from ResourceClaimTemplate {f.ns}/mps (FailedResourceClaimCreation event on "
                "the pod"
            ), v
            assert 'admission webhook "claims.gpu.dradriver.io" denied the request' in v
            assert TYPO_REFUSAL.split(": ", 1)[1] in v  # the field and the nearest name
            assert "Fix: the template was stored before the webhook checked it" in v
            assert f"delete ResourceClaimTemplate {f.ns}/mps and create it" in v


def test_an_unknown_config_field_names_the_nearest_field(faulty: Faulty) -> None:
    """No webhook: the kubelet's prepare refuses the config, naming the allowed fields and
    the one the user most likely meant."""
    faulty.claim("typo-field", config=TYPO_FIELD)
    faulty.pod("typo-field", "typo-field")
    try:

        def said() -> str | None:
            _, lines = faulty.explain("typo-field")
            v = verdict(lines)
            return v if v.startswith("prepare:") else None

        v = wait_for(said, "explain to name the failed prepare", 60, interval=1)
        assert v is not None and "could not prepare its devices" in v
        assert "mpsConfig.defaultActiveThreadPercent: unknown field; did you mean " in v
        assert "defaultActiveThreadPercentage? (allowed here: defaultActiveThreadPercentage," in v
    finally:
        faulty.delete_pods("typo-field")


def test_a_cel_typo_names_the_nearest_published_attribute(faulty: Faulty) -> None:
    """`.product` for `.productName`: every device lacks it, the real scheduler stops at
    the CEL error, and explain names the attribute the slices do publish."""
    faulty.claim("product", f'device.attributes["{D}"].product == "NVIDIA H100 80GB HBM3"')
    faulty.pod("product", "product")
    try:
        wait_for(lambda: faulty.unschedulable("product"), "the scheduler to give up", 20)
        rc, lines = faulty.explain("product")
        v = verdict(lines)
        assert rc == 1 and v.startswith("selector: request gpu selector #0 fails with a CEL"), v
        assert (
            f"no published device has attribute {D}/product: did you mean "
            f'device.attributes["{D}"].productName? Fix: correct the name in the selector to '
            f'device.attributes["{D}"].productName'
        ) in v
    finally:
        faulty.delete_pods("product")
