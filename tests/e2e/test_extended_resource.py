"""The `nvidia.com/gpu` path (Q13 item 3) on the alpha control plane (DRAExtendedResource
on the API server, scheduler, controller manager and kubelet): the chart's extended-resource
DeviceClass lets a pod that asks `resources.limits: nvidia.com/gpu: N`, with no claim, get
N of our GPUs. The real scheduler makes the pod's claim and allocates it, the real kubelet
(hollow node) has the plugin prepare it and hands the container its GPUs through CDI; a
workload chart written for the device plugin is installed unchanged; the scheduler counts
what is taken; nothing is left once the pods go."""

from __future__ import annotations

import contextlib
import io
import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.lines import Line

from .helpers import (
    REPO,
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    apply_object,
    ensure_device_classes,
    get_or_none,
    new_namespace,
    run_helm,
    wait_for,
)

pytestmark = pytest.mark.e2e

DRIVER = "gpu.dradriver.io"
CHART = REPO / "deploy" / "helm" / "dradriver"
APP_CHART = REPO / "tests" / "data" / "device-plugin-chart"
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def extended_class(helm: Any) -> dict[str, Any]:
    """The DeviceClass our chart renders for `extendedResourceClass.enabled`."""
    out = run_helm(
        helm,
        "template",
        "dradriver",
        str(CHART),
        "--kube-version",
        "v1.34.4",
        values={
            "extendedResourceClass": {"enabled": True},
            "featureGates": {"DRAExtendedResource": True},
        },
    )
    (cls,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
    ]
    return dict(cls)


class GpuNode(NodeUnderTest):
    def __init__(
        self, kube: Kube, ns: str, kubelet: HollowNode, plugin: PluginProc, helm: Any, ln: Line
    ) -> None:
        super().__init__(kube, ns, kubelet, plugin)
        self.helm, self.line = helm, ln

    def uuids(self) -> dict[str, str]:
        """Device name -> UUID of this node's published GPUs."""
        out = {}
        for s in self.kube.list(
            path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={self.kubelet.node}"
        )["items"]:
            for d in s["spec"].get("devices") or []:
                out[d["name"]] = d["attributes"]["uuid"]["string"]
        return out

    def pods_of(self, release: str) -> list[dict[str, Any]]:
        return list(
            self.kube.list(
                path_for("v1", "pods", self.ns),
                labelSelector=f"app.kubernetes.io/instance={release}",
            )["items"]
        )

    def install(self, release: str, gpus: int) -> None:
        """The device plugin era's workload chart, its templates untouched; only its own
        values are given (how many GPUs, which node)."""
        out = run_helm(
            self.helm,
            "template",
            release,
            str(APP_CHART),
            "--namespace",
            self.ns,
            values={"gpus": gpus, "nodeSelector": {"kubernetes.io/hostname": self.kubelet.node}},
        )
        for doc in yaml.safe_load_all(out):
            if doc:
                apply_object(self.kube, doc, self.ns)

    def uninstall(self, release: str) -> None:
        self.kube.delete(path_for("apps/v1", "deployments", self.ns, name=release), missing_ok=True)
        wait_for(lambda: not self.pods_of(release), f"the pods of {release} gone", 60)


@pytest.fixture
def gpu_node(
    alpha_cluster: Cluster,
    alpha_kube: Kube,
    helm: Any,
    hollow_node: Callable[..., HollowNode],
) -> Iterator[GpuNode]:
    k = alpha_kube
    ensure_device_classes(k)
    cls = extended_class(helm)
    path = path_for(RES, "deviceclasses", name=cls["metadata"]["name"])
    apply_object(k, cls)
    ns = new_namespace(k, f"extended-{secrets.token_hex(3)}")
    kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
    plugin = PluginProc(alpha_cluster.kubeconfig, kubelet, "fake:4xH100-80GB")
    plugin.start()
    node = GpuNode(k, ns, kubelet, plugin, helm, alpha_cluster.line)
    try:
        wait_for(plugin.ready, "the plugin", 30)
        yield node
    finally:
        for d in k.list(path_for("apps/v1", "deployments", ns))["items"]:
            node.uninstall(d["metadata"]["name"])
        plugin.stop()
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)
        k.delete(path, missing_ok=True)


def running(node: GpuNode, release: str, timeout: float = 90) -> dict[str, Any]:
    def one_running() -> dict[str, Any] | None:
        pods = node.pods_of(release)
        return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" else None

    return wait_for(one_running, f"the pod of {release} Running", timeout)


def the_claim(node: GpuNode, pod: dict[str, Any]) -> dict[str, Any]:
    status = pod["status"]["extendedResourceClaimStatus"]
    claim = node.kube.get(
        path_for(RES, "resourceclaims", node.ns, name=status["resourceClaimName"])
    )
    return dict(claim)


def test_a_device_plugin_chart_gets_our_gpus_unchanged(gpu_node: GpuNode) -> None:
    n = gpu_node
    uuids = n.uuids()
    assert len(uuids) == 4
    n.install("train", gpus=2)
    pod = running(n, "train")
    # The scheduler made the pod's claim (owned by the pod, for our class, one request
    # for the container) and allocated two of our GPUs on this node.
    mapping = pod["status"]["extendedResourceClaimStatus"]
    assert mapping["requestMappings"] == [
        {
            "containerName": "cuda",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-0",
        }
    ]
    claim = the_claim(n, pod)
    assert claim["metadata"]["annotations"][EXTENDED_CLAIM] == "true"
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Pod", pod["metadata"]["uid"])
    (req,) = claim["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "extended.gpu.dradriver.io"
    assert req["exactly"]["count"] == 2
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, n.kubelet.node)}
    got = {uuids[r["device"]] for r in results}
    assert len(got) == 2
    # Prepared by the plugin through the real kubelet: the container has exactly those
    # two GPUs (the runtime's CDI resolution of what the plugin returned).
    env = n.env(pod, "cuda")
    assert set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == got
    assert env["DRADRIVER_CLAIM"] == f"{n.ns}/{claim['metadata']['name']}"
    assert claim["metadata"]["uid"] in n.checkpoint_claims()
    # The kubelet's own record: the claim, its pod and the devices the driver returned.
    infos = [i for i in n.kubelet.claim_infos() if i["ClaimUID"] == claim["metadata"]["uid"]]
    assert len(infos) == 1
    # The claim status the plugin writes, as for any claim.
    wait_for(
        lambda: len(the_claim(n, pod).get("status", {}).get("devices") or []) == 2,
        "status.devices for both GPUs",
        20,
    )

    # Three more do not fit on a node with two free: the scheduler counts what is
    # taken, and says so.
    n.install("eval", gpus=3)

    def unschedulable() -> str:
        pods = n.pods_of("eval")  # none until the ReplicaSet has made it
        for c in pods[0]["status"].get("conditions") or [] if pods else []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message", ""))
        return ""

    why = wait_for(unschedulable, "the 3-GPU pod unschedulable", 30)
    assert "cannot allocate all claims" in why or "nvidia.com/gpu" in why, why

    # Once the first goes, its GPUs are handed back (the claim deleted with its pod,
    # unprepared on the node) and the second gets three.
    first_claim = claim["metadata"]["name"]
    n.uninstall("train")
    wait_for(
        lambda: (
            get_or_none(n.kube, path_for(RES, "resourceclaims", n.ns, name=first_claim)) is None
        ),
        "the first pod's claim deleted with it",
        60,
    )
    pod = running(n, "eval")
    claim = the_claim(n, pod)
    got = {uuids[r["device"]] for r in claim["status"]["allocation"]["devices"]["results"]}
    assert len(got) == 3
    assert set(n.env(pod, "cuda")["NVIDIA_VISIBLE_DEVICES"].split(",")) == got
    assert list(n.checkpoint_claims()) == [claim["metadata"]["uid"]]

    n.uninstall("eval")
    wait_for(lambda: not n.checkpoint_claims(), "the plugin's checkpoint empty", 30)
    assert sorted(p.name for p in n.kubelet.cdi_dir.glob("*-claim-*.json")) == []
    wait_for(
        lambda: (
            not [
                c
                for c in n.kube.list(path_for(RES, "resourceclaims", n.ns))["items"]
                if c["metadata"].get("annotations", {}).get(EXTENDED_CLAIM)
            ]
        ),
        "no extended-resource claim left",
        60,
    )


def test_the_example_pod_asking_the_integer_runs_on_one_of_our_gpus(gpu_node: GpuNode) -> None:
    """examples/claims/nvidia-com-gpu-pod.yaml, as `make demo` runs it: no claim of its
    own, one GPU through the claim the scheduler makes for it."""
    n = gpu_node
    uuids = n.uuids()
    (name,) = n.apply("nvidia-com-gpu-pod")
    pod = n.running(name)
    assert "resourceClaims" not in pod["spec"]
    claim = the_claim(n, pod)
    (req,) = claim["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "extended.gpu.dradriver.io"
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == n.kubelet.node
    assert n.env(pod, "main")["NVIDIA_VISIBLE_DEVICES"] == uuids[result["device"]]
    n.kube.delete(path_for("v1", "pods", n.ns, name=name))
    wait_for(lambda: not n.checkpoint_claims(), "the plugin's checkpoint empty", 60)


def test_no_class_for_the_resource_leaves_the_pod_pending_and_explain_says_why(
    gpu_node: GpuNode,
) -> None:
    """Without the chart's class a pod asking for the integer fits nowhere: no node
    advertises nvidia.com/gpu; explain names the missing class and the chart value."""
    n = gpu_node
    path = path_for(RES, "deviceclasses", name="extended.gpu.dradriver.io")
    cls = n.kube.get(path)
    n.kube.delete(path)
    try:
        n.install("lonely", gpus=1)
        (pod,) = wait_for(lambda: n.pods_of("lonely"), "the pod", 30)
        name = pod["metadata"]["name"]

        def unschedulable() -> bool:
            p = n.kube.get(path_for("v1", "pods", n.ns, name=name))
            return any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in p["status"].get("conditions") or []
            )

        wait_for(unschedulable, "the pod unschedulable", 30)
        report = explain(n, name)
        finding = report["finding"]
        assert finding.startswith("deviceclass: container cuda asks for 1 nvidia.com/gpu"), report
        assert "extendedResourceClass.enabled=true" in finding
    finally:
        n.uninstall("lonely")
        cls["metadata"] = {"name": cls["metadata"]["name"], "labels": cls["metadata"].get("labels")}
        with contextlib.suppress(KubeError):
            n.kube.create(path_for(RES, "deviceclasses"), cls)


def test_explain_weighs_the_integer_as_the_scheduler_does(gpu_node: GpuNode) -> None:
    """A pod asking for more GPUs than any node has: explain builds the request the
    scheduler would (our class, the count) and says no node has five."""
    n = gpu_node
    n.install("big", gpus=5)
    (pod,) = wait_for(lambda: n.pods_of("big"), "the pod", 30)
    report = explain(n, pod["metadata"]["name"])
    assert report["finding"] is not None, report
    (req,) = [r for r in report["requests"] if r["request"]]
    assert req["device_class"] == "extended.gpu.dradriver.io"
    assert req["count"] == "5"
    assert req["request"] == "container-0-request-0"
    (row,) = [r for r in req["rows"] if r["node"] == n.kubelet.node]
    assert row["free"] == 4


def explain(node: GpuNode, pod: str) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        main(
            [
                "explain",
                f"pod/{pod}",
                "-n",
                node.ns,
                "--kubeconfig",
                str(node.plugin.kubeconfig),
                "-o",
                "json",
            ]
        )
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def test_a_finished_pods_extended_claim_keeps_its_gpu_and_fleet_says_so(
    gpu_node: GpuNode,
) -> None:
    """Kubernetes 1.34 (kubernetes/kubernetes#134311): the resourceclaim controller
    releases a finished pod's claims, but not the one the scheduler made for its
    `nvidia.com/gpu`, while the pod exists. Two pods run `true` and finish: the one with
    a claim template gives its GPU back, the one asking nvidia.com/gpu keeps it allocated;
    `dradriver fleet` names that claim, its pod and the fix; deleting the pod frees it.
    From 1.35 the controller releases that claim too (it reads the pod's
    extendedResourceClaimStatus), and fleet has nothing to name."""
    n = gpu_node
    node = n.kubelet.node
    n.kube.create(
        path_for(RES, "resourceclaimtemplates", n.ns),
        {
            "metadata": {"name": "one"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
    )

    def finishing(name: str, resources: dict[str, Any], claims: list[Any]) -> None:
        n.kube.create(
            path_for("v1", "pods", n.ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "resourceClaims": claims,
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "registry.k8s.io/pause:3.10",
                            "command": ["true"],
                            "resources": resources,
                        }
                    ],
                },
            },
        )

    finishing(
        "with-claim",
        {"claims": [{"name": "gpu"}]},
        [{"name": "gpu", "resourceClaimTemplateName": "one"}],
    )
    finishing("with-integer", {"limits": {"nvidia.com/gpu": "1"}}, [])

    def phase(name: str) -> str:
        p = get_or_none(n.kube, path_for("v1", "pods", n.ns, name=name)) or {}
        return str(p.get("status", {}).get("phase"))

    for name in ("with-claim", "with-integer"):
        wait_for(lambda name=name: phase(name) == "Succeeded", f"{name} Succeeded", 60)

    def allocated_claims() -> dict[str, dict[str, Any]]:
        return {
            c["metadata"]["name"]: c
            for c in n.kube.list(path_for(RES, "resourceclaims", n.ns))["items"]
            if (c.get("status") or {}).get("allocation")
        }

    # The template's claim is released (and, made for that pod alone, deleted).
    wait_for(
        lambda: not [c for c in allocated_claims() if c.startswith("with-claim")],
        "the finished pod's template claim released",
        30,
    )
    ext = n.kube.get(path_for("v1", "pods", n.ns, name="with-integer"))["status"][
        "extendedResourceClaimStatus"
    ]["resourceClaimName"]
    fleet = ["fleet", "--kubeconfig", str(n.plugin.kubeconfig), "-n", n.ns]
    if n.line.minor >= 35:
        wait_for(lambda: ext not in allocated_claims(), "the extended claim released", 30)
        wait_for(lambda: not n.checkpoint_claims(), "the plugin's checkpoint empty", 30)
        out = io.StringIO()
        with redirect_stdout(out):
            assert main([*fleet, "-o", "json"]) == 0
        assert json.loads(out.getvalue())["heldByFinishedPods"] == []
        return
    held = allocated_claims()
    assert ext in held, held
    assert [r["uid"] for r in held[ext]["status"]["reservedFor"]] == [
        n.kube.get(path_for("v1", "pods", n.ns, name="with-integer"))["metadata"]["uid"]
    ]
    # The node side is done with it: the kubelet unprepared it when the pod finished.
    wait_for(lambda: not n.checkpoint_claims(), "the plugin's checkpoint empty", 30)

    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*fleet, "-o", "json"]) == 0
    report = json.loads(out.getvalue())
    assert report["heldByFinishedPods"] == [
        {
            "claim": f"{n.ns}/{ext}",
            "pods": [f"{n.ns}/with-integer"],
            "node": node,
            "devices": 1,
            "extendedResourceClaim": True,
        }
    ]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(fleet) == 0
    assert "kubernetes/kubernetes#134311" in out.getvalue()
    assert "ttlSecondsAfterFinished" in out.getvalue()

    n.kube.delete(path_for("v1", "pods", n.ns, name="with-integer"))
    wait_for(lambda: ext not in allocated_claims(), "the claim released with its pod", 60)
