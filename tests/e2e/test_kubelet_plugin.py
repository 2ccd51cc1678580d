"""The kubelet plugin, run as a user runs it, against the real control plane and the
real kubelet (a hollow node) (P3)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from dradriver.api import kubelet as kapi
from dradriver.k8s import Kube, path_for

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    get_or_none,
    publish_slice,
    wait_for,
)

DRIVER = "gpu.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"


class GpuNode(NodeUnderTest):
    def __init__(
        self, kube: Kube, ns: str, kubelet: HollowNode, plugin: PluginProc, cluster: Cluster
    ) -> None:
        super().__init__(kube, ns, kubelet, plugin)
        self.cluster = cluster

    def slices(self) -> list[dict[str, Any]]:
        return list(
            self.kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={self.kubelet.node}"
            )["items"]
        )

    def uuid_of(self, device: str) -> str:
        for s in self.slices():
            for d in s["spec"].get("devices") or []:
                if d["name"] == device:
                    return str(d["attributes"]["uuid"]["string"])
        raise AssertionError(f"{device} not published")

    def claim(
        self,
        name: str,
        count: int = 1,
        cls: str = "gpu.dradriver.io",
        selector: str | None = None,
        constraint: bool = False,
    ) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        devices: dict[str, Any] = {"requests": [{"name": "gpus", "exactly": exactly}]}
        if constraint:
            devices["constraints"] = [
                {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}
            ]
        return self.kube.create(
            path_for(RES, "resourceclaims", self.ns),
            {"metadata": {"name": name}, "spec": {"devices": devices}},
        )

    def pod(
        self,
        name: str,
        claim: str | None = None,
        template: str | None = None,
        containers: tuple[str, ...] = ("main",),
        init: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        def ctr(n: str, command: list[str] | None = None) -> dict[str, Any]:
            c = {"name": n, "image": PAUSE, "resources": {"claims": [{"name": "gpus"}]}}
            return {**c, "command": command} if command else c

        rc: dict[str, Any] = {"name": "gpus"}
        if claim:
            rc["resourceClaimName"] = claim
        else:
            rc["resourceClaimTemplateName"] = template
        spec: dict[str, Any] = {
            "nodeSelector": {"kubernetes.io/hostname": self.kubelet.node},
            "resourceClaims": [rc],
            "containers": [ctr(n) for n in containers],
        }
        if init:
            # `true` completes at once in the hollow node's runtime, as an init container must.
            spec["initContainers"] = [ctr(n, ["true"]) for n in init]
        return self.kube.create(
            path_for("v1", "pods", self.ns), {"metadata": {"name": name}, "spec": spec}
        )

    def cdi_specs(self) -> list[str]:
        return sorted(p.name for p in self.kubelet.cdi_dir.glob("*-claim-*.json"))


@pytest.fixture
def gpu_node(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> Iterator[GpuNode]:
    ensure_device_classes(kube)
    kubelet = hollow_node()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:8xH100-80GB")
    plugin.start()
    node = GpuNode(kube, namespace, kubelet, plugin, cluster)
    try:
        wait_for(plugin.ready, "the plugin to be ready", 30)
        yield node
    finally:
        plugin.stop()


def env_of(node: GpuNode, pod: dict[str, Any], container: str = "main") -> dict[str, str]:
    rec = node.kubelet.container(pod["metadata"]["uid"], container)
    assert rec is not None, f"no record for {container}"
    return dict(e.split("=", 1) for e in rec["env"])


def allocated(node: GpuNode, claim: str) -> list[str]:
    c = node.kube.get(path_for(RES, "resourceclaims", node.ns, name=claim))
    return [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]


def test_one_gpu_pod_gets_its_gpu_by_uuid(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.claim("one")
    pod = n.pod("one", claim="one")
    n.running("one")
    (dev,) = allocated(n, "one")
    env = env_of(n, pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == n.uuid_of(dev)
    assert env["DRADRIVER_CLAIM"] == f"{n.ns}/one"
    # status.devices written for our device, with the UUID and the CDI ID.
    c = wait_for(
        lambda: (
            (x := n.kube.get(path_for(RES, "resourceclaims", n.ns, name="one")))
            .get("status", {})
            .get("devices")
            and x
        ),
        "claim status.devices",
        15,
    )
    (st,) = c["status"]["devices"]
    assert (st["driver"], st["device"], st["pool"]) == (DRIVER, dev, n.kubelet.node)
    assert st["data"]["uuid"] == n.uuid_of(dev)
    assert st["conditions"][0]["type"] == "Ready"
    n.delete("one")
    assert n.cdi_specs() == [] and n.checkpoint_claims() == {}
    # The plugin writes nothing at unprepare: the API server drops our entries itself
    # when the resourceclaim controller deallocates the claim.
    wait_for(
        lambda: (
            not n.kube.get(path_for(RES, "resourceclaims", n.ns, name="one"))
            .get("status", {})
            .get("devices")
        ),
        "status.devices dropped with the allocation",
        15,
    )


def test_four_nvlinked_gpus_and_init_and_two_containers(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.claim("four", count=4, constraint=True)
    pod = n.pod("four", claim="four", containers=("a", "b"), init=("setup",))
    n.running("four")
    devs = allocated(n, "four")
    uuids = {n.uuid_of(d) for d in devs}
    assert len(uuids) == 4
    for ctr in ("setup", "a", "b"):
        assert set(env_of(n, pod, ctr)["NVIDIA_VISIBLE_DEVICES"].split(",")) == uuids


def test_claim_shared_by_two_pods_is_prepared_once(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.claim("shared")
    n.pod("p1", claim="shared")
    n.running("p1")
    n.pod("p2", claim="shared")
    n.running("p2")
    assert n.plugin.metric("dradriver_prepare_duration_seconds_count", result="ok") == 1
    assert len(n.cdi_specs()) == 1
    n.delete("p1")
    assert len(n.cdi_specs()) == 1  # the other pod still uses it
    n.delete("p2")
    wait_for(lambda: n.cdi_specs() == [], "the CDI spec to go", 10)
    assert n.checkpoint_claims() == {}
    assert n.plugin.metric("dradriver_unprepare_duration_seconds_count", result="ok") == 1


def test_two_pods_created_together_share_one_preparation(gpu_node: GpuNode) -> None:
    """The kubelet prepares each pod in its own worker, without a lock across the call:
    two new pods of one claim ask for it at the same time, and both must get the same."""
    n = gpu_node
    n.claim("shared")
    pods = [n.pod(name, claim="shared") for name in ("p1", "p2")]
    for name in ("p1", "p2"):
        n.running(name)
    assert (
        env_of(n, pods[0])["NVIDIA_VISIBLE_DEVICES"] == env_of(n, pods[1])["NVIDIA_VISIBLE_DEVICES"]
    )
    assert len(n.cdi_specs()) == 1 and len(n.checkpoint_claims()) == 1
    (info,) = n.kubelet.claim_infos()
    assert len(info["PodUIDs"]) == 2
    n.delete("p1", "p2")
    wait_for(lambda: n.cdi_specs() == [], "the CDI spec to go", 10)
    assert n.checkpoint_claims() == {} and n.kubelet.claim_infos() == []


def test_kubelet_restart_registers_again_and_republishes(gpu_node: GpuNode) -> None:
    n = gpu_node
    assert len(n.slices()) == 1
    for _ in range(3):
        registrations = n.plugin.log().count("registered with the kubelet")
        n.kubelet.restart()
        # The real kubelet wipes the node's slices in the background once it sees its
        # Node, and that often lands just after the plugin re-registered and republished:
        # the plugin must notice (it watches its slices) and publish again.
        n.kubelet.wait_node_ready(n.kube)
        wait_for(
            lambda r=registrations: n.plugin.log().count("registered with the kubelet") > r,
            "the plugin to register again",
            30,
        )
        wait_for(lambda: len(n.slices()) == 1, "the slices to be republished", 10)
    wait_for(lambda: n.plugin.ready(), "/readyz", 10)


def test_slices_deleted_by_someone_else_are_republished_at_once(gpu_node: GpuNode) -> None:
    n = gpu_node
    (before,) = n.slices()
    devices = len(before["spec"]["devices"])
    wait_for(lambda: n.plugin.metric("dradriver_published_devices") == devices, "the metric", 5)
    n.kube.delete(path_for(RES, "resourceslices", name=before["metadata"]["name"]))
    (after,) = wait_for(n.slices, "the slice to be published again", 10)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert "slice changed by someone else" in n.plugin.log()
    # A change by hand is put right the same way.
    path = path_for(RES, "resourceslices", name=after["metadata"]["name"])
    key = f"{DRIVER}/fingerprint"
    n.kube.patch(path, {"metadata": {"annotations": {key: "tampered"}}})
    wait_for(
        lambda: n.kube.get(path)["metadata"]["annotations"][key] != "tampered",
        "the slice to be rewritten",
        10,
    )
    wait_for(lambda: n.plugin.metric("dradriver_published_devices") == devices, "the metric", 5)


def test_registration_socket_is_recreated_when_removed(gpu_node: GpuNode) -> None:
    n = gpu_node
    (sock,) = list(n.kubelet.registry_dir.glob("*-reg.sock"))
    sock.unlink()
    wait_for(sock.exists, "the registration socket to come back", 3)
    wait_for(
        lambda: n.plugin.log().count("registered with the kubelet") >= 2,
        "the kubelet to register it again",
        10,
    )


def test_dra_socket_is_recreated_when_removed(gpu_node: GpuNode) -> None:
    """Someone cleans the plugin directory: the DRA socket comes back at the same path and
    the real kubelet's next prepare reaches the plugin through it."""
    n = gpu_node
    (sock,) = list((n.kubelet.registry_dir.parent / "plugins" / DRIVER).glob("dra*.sock"))
    sock.unlink()
    wait_for(sock.exists, "the DRA socket to come back", 10)
    assert "DRA socket gone; recreating it" in n.plugin.log()
    n.claim("after-socket")
    n.pod("p-after-socket", claim="after-socket")
    n.running("p-after-socket")


def test_plugin_sigkill_and_restart_keeps_prepared_claims(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.claim("c")
    pod = n.pod("p", claim="c")
    n.running("p")
    n.plugin.stop(signal.SIGKILL)
    spec_before = n.cdi_specs()
    (n.kubelet.cdi_dir / spec_before[0]).unlink()  # as a reboot would wipe /var/run/cdi
    n.plugin.start()
    wait_for(n.plugin.ready, "the restarted plugin", 30)
    assert n.cdi_specs() == spec_before  # restored at startup from the checkpoint
    assert env_of(n, pod)["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    n.delete("p")
    wait_for(lambda: n.cdi_specs() == [], "the CDI spec to go", 10)
    assert n.checkpoint_claims() == {}


def test_unprepare_works_after_the_claim_was_deleted(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.claim("gone")
    n.pod("p", claim="gone")
    n.running("p")
    n.kube.delete(path_for(RES, "resourceclaims", n.ns, name="gone"))
    n.delete("p")
    wait_for(
        lambda: get_or_none(n.kube, path_for(RES, "resourceclaims", n.ns, name="gone")) is None,
        "the claim to be deleted",
        30,
    )
    wait_for(lambda: n.cdi_specs() == [], "the CDI spec to go", 10)
    assert n.checkpoint_claims() == {}


@pytest.mark.whole_suite  # 47 s: on the oldest and the newest line, whose kubelets bracket the rest
def test_hundred_pods_in_sequence_leave_nothing_behind(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.kube.create(
        path_for(RES, "resourceclaimtemplates", n.ns),
        {
            "metadata": {"name": "one"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpus", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
                        ]
                    }
                }
            },
        },
    )
    # Waves of 8 (the node has 8 GPUs), 100 pods in all.
    for wave in range(0, 100, 8):
        names = [f"p{i}" for i in range(wave, min(wave + 8, 100))]
        for name in names:
            n.pod(name, template="one")
        for name in names:
            n.running(name)
        for name in names:
            n.kube.delete(path_for("v1", "pods", n.ns, name=name))
        for name in names:
            n.delete(name)
    wait_for(
        lambda: n.cdi_specs() == [] and n.checkpoint_claims() == {},
        "no CDI file and no checkpoint entry left",
        15,
    )
    # Nor on the kubelet's side: its checkpoint and the runtime's records are empty too.
    assert n.kubelet.claim_infos() == []
    assert list((n.kubelet.root / "cri" / "pods").iterdir()) == []
    assert n.plugin.metric("dradriver_prepare_duration_seconds_count", result="ok") == 100
    assert n.plugin.metric("dradriver_unprepare_duration_seconds_count", result="ok") == 100


@pytest.mark.once
def test_a_burst_of_a_hundred_pods_is_prepared_without_a_failed_call(gpu_node: GpuNode) -> None:
    """A hundred pods made at once, each with its own claim (adminAccess, so that the 8
    GPUs take them all): the kubelet's pod workers call the plugin as the pods arrive,
    many calls at a time on one connection; every pod runs and not one prepare fails (a
    refused stream would be one: grpc-go does not retry a stream reset past the
    server's limit), nor does the kubelet warn of one. Once, on the first line: what it
    checks is the plugin's gRPC server and the kubelet's client, not the API server's."""
    n = gpu_node
    n.kube.patch(
        path_for("v1", "namespaces", name=n.ns),
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    exactly = {"deviceClassName": "gpu.dradriver.io", "adminAccess": True}
    n.kube.create(
        path_for(RES, "resourceclaimtemplates", n.ns),
        {
            "metadata": {"name": "watch"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
        },
    )
    names = [f"b{i}" for i in range(100)]
    for name in names:
        n.pod(name, template="watch")
    for name in names:
        n.running(name, timeout=180)
    assert n.plugin.metric("dradriver_prepare_duration_seconds_count", result="ok") == 100
    assert not n.plugin.metric("dradriver_prepare_duration_seconds_count", result="error")
    # No pod was held up by its claims (a kubelet under load may warn of other things: a
    # token's configmap cache it syncs late, which is not the plugin's).
    events = n.kube.list(path_for("v1", "events", n.ns))["items"]
    dra = [
        (e["reason"], e["message"])
        for e in events
        if e.get("type") == "Warning"
        and (
            e.get("reason") == "FailedPrepareDynamicResources"
            or "resourceclaim" in str(e.get("message", "")).lower()
            or "prepare" in str(e.get("message", "")).lower()
        )
    ]
    assert dra == []
    for name in names:
        n.kube.delete(path_for("v1", "pods", n.ns, name=name))
    wait_for(lambda: n.checkpoint_claims() == {}, "every claim unprepared", 120)


def call(
    node: GpuNode, method: str, claims: list[tuple[str, str, str]], version: str = "v1"
) -> Any:
    msgs = kapi.dra_v1 if version == "v1" else kapi.dra_v1beta1
    grpc_mod = kapi.dra_v1_grpc if version == "v1" else kapi.dra_v1beta1_grpc
    (sock,) = list((node.kubelet.plugins_dir / DRIVER).glob("dra*.sock"))
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = grpc_mod.DRAPluginStub(ch)
        req_cls = (
            msgs.NodePrepareResourcesRequest
            if method == "prepare"
            else msgs.NodeUnprepareResourcesRequest
        )
        req = req_cls(claims=[msgs.Claim(namespace=a, uid=b, name=c) for a, b, c in claims])
        fn = stub.NodePrepareResources if method == "prepare" else stub.NodeUnprepareResources
        return fn(req, timeout=10)


def test_malformed_requests_get_clear_per_claim_errors(
    gpu_node: GpuNode, cleanup: Callable[[str], None]
) -> None:
    n = gpu_node
    # A claim allocated a device of another driver only (its slice on the same node).
    other = "other.example.com"
    publish_slice(n.kube, n.kubelet.node, other, ["nic-0"], cleanup)
    cleanup(path_for(RES, "deviceclasses", name=f"other-{n.ns}"))
    n.kube.create(
        path_for(RES, "deviceclasses"),
        {
            "metadata": {"name": f"other-{n.ns}"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{other}"'}}]},
        },
    )
    n.claim("foreign", cls=f"other-{n.ns}")
    n.pod("foreign", claim="foreign")
    foreign = wait_for(
        lambda: (
            (c := n.kube.get(path_for(RES, "resourceclaims", n.ns, name="foreign")))
            .get("status", {})
            .get("reservedFor")
            and c
        ),
        "the foreign claim",
        30,
    )
    # And a good claim, prepared already: one call carries good and bad claims alike.
    n.claim("good")
    n.pod("good", claim="good")
    n.running("good")
    good = n.kube.get(path_for(RES, "resourceclaims", n.ns, name="good"))
    before = sorted(p.name for p in n.kubelet.root.parent.rglob("*"))
    claims = [
        (n.ns, good["metadata"]["uid"], "good"),
        (n.ns, foreign["metadata"]["uid"], "foreign"),
        (n.ns, "", "empty-uid"),
        (n.ns, "0b5e8c3a-1111-2222-3333-444455556666", "no-such-claim"),
        (n.ns, "0b5e8c3a-1111-2222-3333-444455556667", "../../etc/passwd"),
        (n.ns, "../../../tmp/evil", "x"),
        ("..", "0b5e8c3a-1111-2222-3333-444455556668", "dots"),
    ]
    resp = call(n, "prepare", claims)
    errors = {uid: resp.claims[uid].error for _, uid, _ in claims}
    assert errors[good["metadata"]["uid"]] == ""  # one bad claim fails alone
    assert len(resp.claims[good["metadata"]["uid"]].devices) == 1
    assert f"has no device of driver {DRIVER}" in errors[foreign["metadata"]["uid"]]
    assert "empty UID" in errors[""]
    assert "not found" in errors["0b5e8c3a-1111-2222-3333-444455556666"]
    assert "not a valid Kubernetes name" in errors["0b5e8c3a-1111-2222-3333-444455556667"]
    assert "not a Kubernetes UID" in errors["../../../tmp/evil"]
    assert "not a valid Kubernetes name" in errors["0b5e8c3a-1111-2222-3333-444455556668"]
    assert all(not resp.claims[u].devices for u in list(errors)[1:])
    # v1beta1 is served on the same socket, with the same answers.
    beta = call(n, "prepare", claims[2:3], version="v1beta1")
    assert "empty UID" in beta.claims[""].error
    # Unknown claims unprepare successfully (the kubelet may repeat itself).
    un = call(n, "unprepare", claims[3:4])
    assert un.claims[claims[3][1]].error == ""
    after = sorted(p.name for p in n.kubelet.root.parent.rglob("*"))
    assert [p for p in after if p not in before and not p.endswith(".log")] == []
    assert len(n.cdi_specs()) == 1 and list(n.checkpoint_claims()) == [good["metadata"]["uid"]]
    assert n.plugin.alive()


def test_device_is_never_prepared_for_two_claims(gpu_node: GpuNode) -> None:
    """Even if something upstream hands one device to two claims (here: a claim we
    allocate by hand, as a broken controller might), prepare refuses the second."""
    n = gpu_node
    n.claim("first")
    n.pod("p", claim="first")
    n.running("p")
    (dev,) = allocated(n, "first")
    c = n.kube.create(
        path_for(RES, "resourceclaims", n.ns),
        {
            "metadata": {"name": "second"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
                    ]
                }
            },
        },
    )
    # Bound and reserved by hand too: from 1.37 the scheduler itself would keep the pod
    # Pending, its device being another claim's.
    p2 = n.kube.create(
        path_for("v1", "pods", n.ns),
        {
            "metadata": {"name": "p2"},
            "spec": {
                "nodeName": n.kubelet.node,
                "resourceClaims": [{"name": "gpus", "resourceClaimName": "second"}],
                "containers": [
                    {"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpus"}]}}
                ],
            },
        },
    )
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpus", "driver": DRIVER, "pool": n.kubelet.node, "device": dev}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [n.kubelet.node]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p2", "uid": p2["metadata"]["uid"]}],
    }
    n.kube.replace(path_for(RES, "resourceclaims", n.ns, name="second", subresource="status"), c)

    def refused() -> list[dict[str, Any]]:
        evs = n.kube.list(path_for("v1", "events", n.ns), fieldSelector="involvedObject.name=p2")[
            "items"
        ]
        return [e for e in evs if "already prepared" in e["message"]]

    (ev,) = wait_for(refused, "the prepare of the second claim to be refused", 30)
    assert f"device {dev} is already prepared for claim {n.ns}/first" in ev["message"]
    assert len(n.checkpoint_claims()) == 1
    assert len(n.cdi_specs()) == 1
    # The kubelet records a claim before asking the plugin to prepare it, so deleting the
    # refused pod unprepares a claim the plugin never prepared: that must not free the
    # device of the claim that holds it.
    unprepared = n.plugin.metric("dradriver_unprepare_duration_seconds_count", result="ok")
    n.delete("p2")
    assert n.plugin.metric("dradriver_unprepare_duration_seconds_count", result="ok") == (
        unprepared + 1
    )
    (held,) = n.checkpoint_claims().values()
    assert held["name"] == "first" and len(n.cdi_specs()) == 1
    assert n.kube.get(path_for("v1", "pods", n.ns, name="p"))["status"]["phase"] == "Running"


def test_two_instances_run_side_by_side(gpu_node: GpuNode) -> None:
    """A rolling update: a second instance with its own sockets and the same state."""
    n = gpu_node
    second = PluginProc(
        n.cluster.kubeconfig,
        n.kubelet,
        "fake:8xH100-80GB",
        state_dir=n.plugin.state_dir,
        instance="b",
    )
    second.start()
    try:
        wait_for(second.ready, "the second instance", 30)
        assert len(list(n.kubelet.registry_dir.glob("*-reg.sock"))) == 2
        n.claim("c")
        n.pod("p", claim="c")
        n.running("p")
        n.plugin.stop()  # the old instance goes away; the new one serves unprepare
        n.delete("p")
        wait_for(lambda: n.cdi_specs() == [], "the CDI spec to go", 10)
        assert n.checkpoint_claims() == {}
        assert second.metric("dradriver_unprepare_duration_seconds_count", result="ok") == 1
    finally:
        second.stop()


def test_sigterm_removes_sockets(gpu_node: GpuNode) -> None:
    n = gpu_node
    n.plugin.stop(signal.SIGTERM)
    assert n.plugin.proc is not None and n.plugin.proc.returncode == 0
    assert list(n.kubelet.registry_dir.glob("*.sock")) == []
    assert list((n.kubelet.plugins_dir / DRIVER).glob("*.sock")) == []


def test_sighup_triggers_a_rediscovery(gpu_node: GpuNode) -> None:
    n = gpu_node
    assert n.plugin.proc is not None
    before = n.plugin.log().count("devices rediscovered")
    assert before >= 1  # the first publication; the next one is 300 s away
    n.plugin.proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: n.plugin.log().count("devices rediscovered") > before,
        "a rediscovery after SIGHUP",
        10,
    )
    last = [line for line in n.plugin.log().splitlines() if "devices rediscovered" in line][-1]
    assert "writes=0" in last  # nothing changed on the node: nothing written
    assert n.plugin.alive()


def test_admin_access_through_the_scheduler_and_the_kubelet(gpu_node: GpuNode) -> None:
    """A monitoring pod asks for the GPU a workload holds, with adminAccess: the real
    scheduler allocates it beside the workload's claim, the kubelet prepares it, and its
    end leaves the workload's claim prepared."""
    n = gpu_node
    n.kube.patch(
        path_for("v1", "namespaces", name=n.ns),
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    first = f'device.attributes["{DRIVER}"].index == 0'
    n.claim("work", selector=first)
    work = n.pod("work", claim="work")
    n.running("work")
    n.kube.create(
        path_for(RES, "resourceclaims", n.ns),
        {
            "metadata": {"name": "monitor"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": "gpu.dradriver.io",
                                "selectors": [{"cel": {"expression": first}}],
                                "adminAccess": True,
                            },
                        }
                    ]
                }
            },
        },
    )
    monitor = n.pod("monitor", claim="monitor")
    n.running("monitor")
    assert allocated(n, "monitor") == allocated(n, "work") == [n.real("gpu-0")]
    same = env_of(n, monitor)["NVIDIA_VISIBLE_DEVICES"]
    assert same == env_of(n, work)["NVIDIA_VISIBLE_DEVICES"]
    assert len(n.checkpoint_claims()) == 2
    n.delete("monitor")
    wait_for(lambda: len(n.checkpoint_claims()) == 1, "the monitor's claim released", 15)
    (left,) = n.checkpoint_claims().values()
    assert left["name"] == "work" and len(n.cdi_specs()) == 1


def test_readyz_says_why_nvml_is_not_answering(
    cluster: Cluster, hollow_node: Callable[..., HollowNode]
) -> None:
    """No NVIDIA driver on this machine: /readyz names the NVML layer and NVML's own
    error, not "not discovered yet"."""
    kubelet = hollow_node()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "nvml")
    plugin.start()
    try:

        def said() -> str | None:
            code, body = plugin.http("/readyz")
            return body if code == 503 and "NVML layer" in body else None

        body = wait_for(said, "/readyz to name the NVML layer", 20)
        assert "not discovered yet" not in body
    finally:
        plugin.stop()


def test_claim_status_off_writes_nothing_to_the_claim(
    cluster: Cluster, kube: Kube, namespace: str, hollow_node: Callable[..., HollowNode]
) -> None:
    """--claim-status off: the pod runs, and the plugin never writes the claim."""
    ensure_device_classes(kube)
    kubelet = hollow_node()
    plugin = PluginProc(
        cluster.kubeconfig, kubelet, "fake:1xL4", extra_args=["--claim-status", "off"]
    )
    plugin.start()
    try:
        wait_for(plugin.ready, "the plugin to be ready", 30)
        n = GpuNode(kube, namespace, kubelet, plugin, cluster)
        n.claim("quiet")
        n.pod("quiet", claim="quiet")
        n.running("quiet")
        time.sleep(2)  # past the second after which status would have been written
        claim = kube.get(path_for(RES, "resourceclaims", namespace, name="quiet"))
        assert not claim.get("status", {}).get("devices")
        managers = {m.get("manager") for m in claim["metadata"].get("managedFields", [])}
        assert DRIVER not in managers
        n.delete("quiet")
    finally:
        plugin.stop()
