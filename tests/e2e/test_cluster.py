"""The local control plane is real Kubernetes of the line $K8S names (1.34 by default):
version, DRA API, authorization, ServiceAccount tokens bound to pods, and the alpha gates
when asked for. `dradriver dev cluster up` also applies the DeviceClasses and, with
--webhook, runs the admission webhook, which `down` stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.lines import Line
from dradriver_dev import addons
from dradriver_dev import cluster as devcluster

from .helpers import Cluster, load_yaml, wait_for

CLASSES = [d["metadata"]["name"] for d in load_yaml(addons.DEVICE_CLASSES)]


def dev_cluster(action: str, state_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`dradriver dev cluster ACTION` as `make cluster-up` / `make cluster-down` run it."""
    cli = [sys.executable, "-m", "dradriver.cli", "dev", "cluster"]
    return subprocess.run(
        [*cli, action, "--state-dir", str(state_dir), *flags],
        capture_output=True,
        text=True,
        timeout=240,
    )


def kubectl(c: Cluster, *args: str) -> str:
    assert c.bin_dir is not None, "needs the locally built kubectl"
    out = subprocess.run(
        [str(c.bin_dir / "kubectl"), "--kubeconfig", c.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_client_and_server_report_the_line(cluster: Cluster) -> None:
    """The control plane and kubectl are the release of the line $K8S names."""
    if cluster.bin_dir is None:
        pytest.skip("external cluster: no locally built kubectl")
    v = json.loads(kubectl(cluster, "version", "-o", "json"))
    assert v["clientVersion"]["gitVersion"] == cluster.line.release
    assert v["serverVersion"]["gitVersion"] == cluster.line.release
    minor = str(cluster.line.minor)
    assert (v["serverVersion"]["major"], v["serverVersion"]["minor"]) == ("1", minor)


def test_resource_v1_is_served_and_alpha_is_not(kube: Kube, cluster: Cluster) -> None:
    groups = kube.get("/apis/resource.k8s.io")
    versions = {v["version"] for v in groups["versions"]}
    assert "v1" in versions
    assert "v1alpha3" not in versions  # GA defaults unless ALPHA=1
    kinds = {r["kind"] for r in kube.get("/apis/resource.k8s.io/v1")["resources"]}
    assert {"ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass"} <= kinds


def test_serviceaccount_token_bound_to_pod_carries_node_and_rbac_applies(
    kube: Kube, namespace: str, cleanup: object
) -> None:
    ns = namespace
    node = f"authz-{ns[-6:]}"
    kube.create(path_for("v1", "nodes"), {"metadata": {"name": node}})
    try:
        kube.create(path_for("v1", "serviceaccounts", ns), {"metadata": {"name": "plugin"}})
        pod = kube.create(
            path_for("v1", "pods", ns),
            {
                "metadata": {"name": "plugin"},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": "plugin",
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        )
        tr = kube.create(
            path_for("v1", "serviceaccounts", ns, name="plugin", subresource="token"),
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "plugin",
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        )
        as_plugin = kube.with_token(tr["status"]["token"])
        review = as_plugin.create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:serviceaccount:{ns}:plugin"
        # What a ValidatingAdmissionPolicy keys "own node only" on.
        assert user["extra"]["authentication.kubernetes.io/node-name"] == [node]
        assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]

        slices = path_for("resource.k8s.io/v1", "resourceslices")
        with pytest.raises(KubeError) as denied:
            as_plugin.list(slices)
        assert denied.value.status == 403  # RBAC is enforced: no AlwaysAllow

        role = f"{ns}-slices"
        kube.create(
            path_for("rbac.authorization.k8s.io/v1", "clusterroles"),
            {
                "metadata": {"name": role},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceslices"],
                        "verbs": ["list"],
                    }
                ],
            },
        )
        kube.create(
            path_for("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
            {
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "plugin", "namespace": ns}],
            },
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert "items" in as_plugin.list(slices)
                    break
                except KubeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            kube.delete(path_for("rbac.authorization.k8s.io/v1", "clusterrolebindings", name=role))
            kube.delete(path_for("rbac.authorization.k8s.io/v1", "clusterroles", name=role))
        as_plugin.close()
    finally:
        kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)


def counter_slices(name: str, node: str, consumes: bool, ln: Line) -> list[dict[str, Any]]:
    """One shared counter set and a device that consumes from it if `consumes`: in one
    slice on 1.34, in two from 1.35 (a slice holds devices or counter sets, not both)."""
    device: dict[str, Any] = {"name": "gpu-0-part" if consumes else "gpu-0"}
    if consumes:
        device["consumesCounters"] = [
            {"counterSet": "gpu-0", "counters": {"slices": {"value": "4"}}}
        ]
    counters = [{"name": "gpu-0", "counters": {"slices": {"value": "8"}}}]
    parts = [{"sharedCounters": counters}, {"devices": [device]}]
    if not ln.counters_apart:
        parts = [{"sharedCounters": counters, "devices": [device]}]
    return [
        {
            "metadata": {"name": f"{name}-{i}"},
            "spec": {
                "driver": "gpu.dradriver.io",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(parts)},
                **part,
            },
        }
        for i, part in enumerate(parts)
    ]


def create_counter_slices(
    kube: Kube, name: str, node: str, consumes: bool, ln: Line
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The slices as stored: (with the counter set, with the device)."""
    stored = [
        kube.create(path_for("resource.k8s.io/v1", "resourceslices"), s)
        for s in counter_slices(name, node, consumes, ln)
    ]
    return stored[:1], stored[-1:]


def delete_counter_slices(kube: Kube, name: str, node: str) -> None:
    for i in range(2):
        path = path_for("resource.k8s.io/v1", "resourceslices", name=f"{name}-{i}")
        kube.delete(path, missing_ok=True)
    kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)


def test_alpha_gates_on_every_component(alpha_cluster: Cluster) -> None:
    """The "alpha" cluster has every DRA feature the driver has: on 1.34 and 1.35 by the
    gates turned on, on every component; from 1.36 by the line's defaults, no gate set."""
    turned_on = devcluster.alpha_gates(alpha_cluster.line)
    kube = Kube.from_kubeconfig(alpha_cluster.kubeconfig)
    versions = {v["version"] for v in kube.get("/apis/resource.k8s.io")["versions"]}
    if turned_on:
        assert "v1alpha3" in versions
        kinds = {r["kind"] for r in kube.get("/apis/resource.k8s.io/v1alpha3")["resources"]}
        assert "DeviceTaintRule" in kinds
    else:
        assert versions == {"v1"}
    # The features are really on in the API server: a slice with shared counters and a
    # partition consuming them is kept, not silently stripped.
    name = "alpha-counters"
    kube.create(path_for("v1", "nodes"), {"metadata": {"name": "alpha-node"}})
    try:
        (counters,), (device,) = create_counter_slices(
            kube, name, "alpha-node", True, alpha_cluster.line
        )
        assert counters["spec"]["sharedCounters"][0]["name"] == "gpu-0"
        assert device["spec"]["devices"][0]["consumesCounters"][0]["counterSet"] == "gpu-0"
    finally:
        delete_counter_slices(kube, name, "alpha-node")
    if alpha_cluster.state_dir is None:
        return  # an external cluster: its processes are not ours to inspect
    st = devcluster.ClusterState.load(alpha_cluster.state_dir)
    assert st is not None and st.k8s == alpha_cluster.line.name
    for component in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        cmdline = Path(f"/proc/{st.pids[component]}/cmdline").read_bytes().split(b"\0")
        gates = next((a for a in cmdline if a.startswith(b"--feature-gates=")), b"")
        for g in turned_on:
            assert f"{g}=true".encode() in gates, (component, g)
        if not turned_on:
            assert gates == b"", (component, gates)  # nothing to turn on: the defaults
    kube.close()


def test_default_cluster_has_the_lines_default_gates(cluster: Cluster, kube: Kube) -> None:
    """Without DRAPartitionableDevices (off by default up to 1.35) counters are dropped;
    from 1.36 the default cluster keeps them, no gate turned on."""
    kube.create(path_for("v1", "nodes"), {"metadata": {"name": "ga-node"}})
    name = "ga-counters"
    try:
        (counters,), _ = create_counter_slices(kube, name, "ga-node", False, cluster.line)
        if cluster.has("DRAPartitionableDevices"):
            assert counters["spec"]["sharedCounters"][0]["name"] == "gpu-0"
        else:
            assert "sharedCounters" not in counters["spec"]
    except KubeError as exc:
        # Either dropping or refusing the field proves the gate is off.
        assert not cluster.has("DRAPartitionableDevices") and exc.status in (400, 422), exc
    finally:
        delete_counter_slices(kube, name, "ga-node")


def test_cluster_up_never_silently_replaces_a_running_cluster(
    cluster: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """`make cluster-up` on a running cluster says it is kept (and puts back a DeviceClass
    deleted since); on one running only in part it refuses without --replace (it used to
    tear it down and start another)."""
    if cluster.state_dir is None:
        pytest.skip("an external cluster: no state directory to run against")

    def up(state_dir: Path) -> subprocess.CompletedProcess[str]:
        return dev_cluster("up", state_dir)

    # `up` applied the DeviceClasses when it started the cluster; one deleted since is
    # applied again by the next `up`, which changes nothing else.
    assert set(CLASSES) == {"gpu.dradriver.io", "mig.dradriver.io", "imex-channel.dradriver.io"}
    for name in CLASSES:
        kube.get(path_for("resource.k8s.io/v1", "deviceclasses", name=name))
    kube.delete(path_for("resource.k8s.io/v1", "deviceclasses", name=CLASSES[1]))
    kept = up(cluster.state_dir)
    assert kept.returncode == 0, kept.stderr
    assert "already running" in kept.stdout and "kept as it is" in kept.stdout
    assert f"DeviceClasses {', '.join(CLASSES)} applied" in kept.stdout
    assert "CRDs computedomains.gpu.dradriver.io applied" in kept.stdout
    for name in CLASSES:
        kube.get(path_for("resource.k8s.io/v1", "deviceclasses", name=name))
    # Half a cluster: one live process (this test's sleep) and one that has exited.
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        partial = tmp_path / "partial"
        partial.mkdir()
        (partial / "cluster.json").write_text(
            json.dumps(
                {
                    "state_dir": str(partial),
                    "bin_dir": "/nonexistent",
                    "kubeconfig": str(partial / "kubeconfig"),
                    "server": "https://127.0.0.1:1",
                    "alpha": False,
                    "pids": {"etcd": sleeper.pid, "kube-apiserver": gone.pid},
                }
            )
        )
        refused = up(partial)
        assert refused.returncode == 1
        assert "running only in part (kube-apiserver stopped)" in refused.stderr
        assert "--replace" in refused.stderr
        assert sleeper.poll() is None  # nothing was stopped
    finally:
        sleeper.kill()
        sleeper.wait()


def test_cluster_up_webhook_refuses_bad_configs_and_down_stops_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`make cluster-up WEBHOOK=1`: a fresh cluster with the DeviceClasses and the admission
    webhook; a claim with a bad config for the driver is refused at apply time, one
    without is admitted; `up` again keeps the webhook, or restarts one that died; `make
    cluster-down` leaves no process behind."""
    if cluster.bin_dir is None:
        pytest.skip("external cluster: no locally built control plane to start another")
    state_dir = tmp_path / "dev"
    try:
        started = dev_cluster("up", state_dir, "--webhook")
        assert started.returncode == 0, started.stderr
        st = devcluster.ClusterState.load(state_dir)
        assert st is not None
        port, healthz = st.ports["webhook"], st.ports["webhook-healthz"]
        assert (
            f"admission webhook (dradriver controller) at https://127.0.0.1:{port}/validate, "
            f"readyz http://127.0.0.1:{healthz}/readyz" in started.stdout
        )
        kube = Kube.from_kubeconfig(st.kubeconfig)
        claims = path_for("resource.k8s.io/v1", "resourceclaims", "default")
        for name in CLASSES:
            kube.get(path_for("resource.k8s.io/v1", "deviceclasses", name=name))

        manifest = tmp_path / "bad.yaml"
        manifest.write_text(json.dumps(addons.bad_claim("bad")))
        kubectl = [str(state_dir / "kubectl"), "--kubeconfig", st.kubeconfig]
        applied = subprocess.run(
            [*kubectl, "apply", "-f", str(manifest)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert applied.returncode == 1, applied
        assert (
            f'admission webhook "{addons.WEBHOOK_NAME}" denied the request: ResourceClaim '
            '"bad": spec.devices.config[0].opaque.parameters.sharing.strategy: Input should '
            "be 'TimeSlicing' or 'MPS' (got 'Spatial')" in applied.stderr
        )
        plain = addons.bad_claim("plain")
        del plain["spec"]["devices"]["config"]
        kube.create(claims, plain)  # no config for the driver: never sent to the webhook

        controller = st.pids[addons.WEBHOOK_PROCESS]
        again = dev_cluster("up", state_dir, "--webhook")
        assert again.returncode == 0, again.stderr
        assert "kept as it is" in again.stdout
        reloaded = devcluster.ClusterState.load(state_dir)
        assert reloaded is not None and reloaded.pids[addons.WEBHOOK_PROCESS] == controller

        # A webhook that died is started again, on new ports, and refuses again.
        os.killpg(controller, signal.SIGKILL)
        wait_for(lambda: not devcluster._alive(controller), "the controller gone", 10)
        restarted = dev_cluster("up", state_dir, "--webhook")
        assert restarted.returncode == 0, restarted.stderr
        st = devcluster.ClusterState.load(state_dir)
        assert st is not None and st.pids[addons.WEBHOOK_PROCESS] != controller
        with pytest.raises(KubeError) as refused:
            kube.create(claims, addons.bad_claim("bad-again"))
        assert "denied the request" in refused.value.message
        kube.close()
    finally:
        last = devcluster.ClusterState.load(state_dir)
        pids = list(last.pids.values()) if last else []
        stopped = dev_cluster("down", state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "dev cluster: stopped and removed"
    assert [p for p in pids if devcluster._alive(p)] == []
    assert not state_dir.exists()
