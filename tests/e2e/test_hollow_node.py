"""The hollow node is the real kubelet where DRA is concerned, with a stand-in plugin that
records every call: claims shared by containers and pods, kubelet restarts (killed and
started again, with its own checkpoint), its events and pod status, CDI resolved by the
runtime, the node's own identity, and slices of an unreachable driver wiped."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.lines import OLDEST, Line
from tests.support.standin import StandinPlugin

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    device_class,
    get_or_none,
    publish_slice,
    wait_for,
)

DRIVER = "node.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"


class Env:
    line: Line = OLDEST

    def __init__(self, kube: Kube, ns: str, kubelet: HollowNode, cls: str) -> None:
        self.kube, self.ns, self.kubelet, self.cls = kube, ns, kubelet, cls
        self.plugin = self._standin()

    def _standin(self, **kw: Any) -> StandinPlugin:
        k = self.kubelet
        return StandinPlugin(self.kube, DRIVER, k.registry_dir, k.plugins_dir, k.cdi_dir, **kw)

    def start_plugin(self, **kw: Any) -> StandinPlugin:
        self.plugin = self._standin(**kw)
        self.plugin.start()
        assert self.plugin.registered.wait(15), self.kubelet.log()[-2000:]
        return self.plugin

    def claim(self, name: str, count: int = 1) -> dict[str, Any]:
        return self.kube.create(
            path_for(RES, "resourceclaims", self.ns),
            {
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "dev",
                                "exactly": {"deviceClassName": self.cls, "count": count},
                            }
                        ]
                    }
                },
            },
        )

    def pod(
        self,
        name: str,
        claim: str,
        containers: list[str] | None = None,
        init: list[str] | None = None,
    ) -> dict[str, Any]:
        def ctr(n: str, command: list[str] | None = None) -> dict[str, Any]:
            c = {"name": n, "image": PAUSE, "resources": {"claims": [{"name": "dev"}]}}
            return {**c, "command": command} if command else c

        spec: dict[str, Any] = {
            "nodeSelector": {"kubernetes.io/hostname": self.kubelet.node},
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            "containers": [ctr(n) for n in containers or ["main"]],
        }
        if init:
            # `true` completes at once in the hollow node's runtime.
            spec["initContainers"] = [ctr(n, ["true"]) for n in init]
        return self.kube.create(
            path_for("v1", "pods", self.ns), {"metadata": {"name": name}, "spec": spec}
        )

    def pod_path(self, name: str) -> str:
        return path_for("v1", "pods", self.ns, name=name)

    def wait_running(self, name: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: (
                (p := get_or_none(self.kube, self.pod_path(name)))
                and p.get("status", {}).get("phase") == "Running"
                and p
            ),
            f"pod {name} to run",
            timeout,
        )

    def wait_deleted(self, name: str, timeout: float = 30) -> None:
        wait_for(
            lambda: get_or_none(self.kube, self.pod_path(name)) is None,
            f"pod {name} to be deleted",
            timeout,
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        evs = self.kube.list(
            path_for("v1", "events", self.ns), fieldSelector=f"involvedObject.name={name}"
        )["items"]
        return [e for e in evs if e.get("source", {}).get("component") == "kubelet"]

    def claim_uid(self, name: str) -> str:
        return str(
            self.kube.get(path_for(RES, "resourceclaims", self.ns, name=name))["metadata"]["uid"]
        )

    def slices(self) -> list[Any]:
        return list(
            self.kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={self.kubelet.node}"
            )["items"]
        )


@pytest.fixture
def env(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    hollow_node: Callable[..., HollowNode],
    cleanup: Callable[[str], None],
) -> Iterator[Env]:
    kubelet = hollow_node()
    cls = device_class(kube, DRIVER, cleanup)
    e = Env(kube, namespace, kubelet, cls)
    e.line = cluster.line
    yield e
    e.plugin.stop()


def test_node_is_the_lines_kubelet_with_its_own_identity(env: Env) -> None:
    node = env.kube.get(path_for("v1", "nodes", name=env.kubelet.node))
    assert node["status"]["nodeInfo"]["kubeletVersion"] == env.line.release
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == env.kubelet.node
    # It acts as system:node:<name>, so the Node authorizer and NodeRestriction hold it
    # to its own node, as they hold a production kubelet.
    as_node = Kube.from_kubeconfig(str(env.kubelet.root / "kubelet.kubeconfig"))
    try:
        review = as_node.create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:node:{env.kubelet.node}"
        assert "system:nodes" in user["groups"]
        with pytest.raises(KubeError) as refused:
            as_node.list(path_for("v1", "secrets", env.ns))
        assert refused.value.status == 403
    finally:
        as_node.close()


def test_containers_and_init_container_share_a_claim(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0", "dev-1"], cleanup)
    env.claim("two", count=2)
    pod = env.pod("p", "two", containers=["a", "b"], init=["setup"])
    running = env.wait_running("p")
    uid = pod["metadata"]["uid"]
    ids = sorted(f"test.dradriver.io/standin={env.claim_uid('two')}-dev-{i}" for i in (0, 1))
    for name in ("setup", "a", "b"):
        rec = env.kubelet.container(uid, name)
        assert rec is not None, name
        assert sorted(rec["cdiDevices"]) == ids
        assert {"STANDIN_DEVICE_DEV_0=dev-0", "STANDIN_DEVICE_DEV_1=dev-1"} <= set(rec["env"])
    init_state = running["status"]["initContainerStatuses"][0]["state"]
    assert init_state["terminated"]["reason"] == "Completed"
    assert len(env.plugin.calls_of("NodePrepareResources")) == 1


def test_claim_shared_by_two_pods_is_prepared_once_and_unprepared_after_the_last(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("shared")
    env.pod("first", "shared")
    env.wait_running("first")
    env.pod("second", "shared")
    env.wait_running("second")
    claim_uid = env.claim_uid("shared")
    assert [c.claims for c in env.plugin.calls_of("NodePrepareResources")] == [
        [(env.ns, claim_uid, "shared")]
    ]
    (info,) = env.kubelet.claim_infos()
    assert info["ClaimUID"] == claim_uid and len(info["PodUIDs"]) == 2

    env.kube.delete(env.pod_path("first"))
    env.wait_deleted("first")
    assert env.plugin.calls_of("NodeUnprepareResources") == []  # "second" still uses it
    env.kube.delete(env.pod_path("second"))
    env.wait_deleted("second")
    assert [c.claims for c in env.plugin.calls_of("NodeUnprepareResources")] == [
        [(env.ns, claim_uid, "shared")]
    ]
    assert env.kubelet.claim_infos() == []


def test_plugin_failure_is_an_event_and_the_pod_starts_once_it_is_fixed(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    # No plugin registered yet: the kubelet says so on the pod.
    ev = wait_for(
        lambda: [e for e in env.events("p") if e["reason"] == "FailedPrepareDynamicResources"],
        "an event",
        60,
    )
    assert f"DRA driver {DRIVER} is not registered" in ev[0]["message"]
    pod = wait_for(
        lambda: (p := env.kube.get(env.pod_path("p")))["status"].get("containerStatuses") and p,
        "the container status",
        20,
    )
    assert pod["status"]["phase"] == "Pending"
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"

    # The plugin answers with a per-claim error: that text reaches the user.
    env.start_plugin(fail_claims={"c": "GPU gpu-3 is in use by another claim"})
    ev = wait_for(
        lambda: [e for e in env.events("p") if "in use" in e["message"]],
        "the plugin's error as an event",
        60,
    )
    assert ev[0]["type"] == "Warning"
    assert (
        "NodePrepareResources failed for ResourceClaim c: GPU gpu-3 is in use" in (ev[0]["message"])
    )
    # Fixed: the kubelet's retry with backoff succeeds without anyone touching the pod.
    env.plugin.fail_claims.clear()
    env.wait_running("p", timeout=90)
    assert env.kubelet.alive()


def test_unresolvable_cdi_device_fails_the_container_with_the_runtimes_message(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin(bogus_cdi_id="test.dradriver.io/standin=no-such-device")
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    # containerd's words, passed on by the kubelet as it passes on containerd's.
    want = (
        "failed to create containerd container: CDI device injection failed: "
        "unresolvable CDI devices test.dradriver.io/standin=no-such-device"
    )
    ev = wait_for(
        lambda: [e for e in env.events("p") if e["reason"] == "Failed"], "a Failed event", 30
    )
    assert want in ev[0]["message"]
    pod = wait_for(
        lambda: (
            (p := env.kube.get(env.pod_path("p")))["status"]
            .get("containerStatuses", [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "CreateContainerError"
            and p
        ),
        "the container status",
        20,
    )
    assert want in pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    # Deleting the failed pod still unprepares the claim: nothing leaks.
    env.kube.delete(env.pod_path("p"))
    env.wait_deleted("p")
    assert len(env.plugin.calls_of("NodeUnprepareResources")) == 1
    assert env.kubelet.claim_infos() == []


def test_kubelet_restart_leaves_running_pods_alone_and_keeps_its_checkpoint(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    pod = env.pod("p", "c")
    env.wait_running("p")
    uid = pod["metadata"]["uid"]
    before = env.kubelet.container(uid, "main")
    assert before is not None
    (info,) = env.kubelet.claim_infos()

    env.kubelet.restart(signal.SIGKILL)
    wait_for(lambda: len(env.plugin.registrations) == 2, "a second registration", 30)
    assert env.plugin.registrations == [(True, ""), (True, "")]
    # The runtime kept the pod's sandbox, so the kubelet has nothing to prepare: the pod
    # is untouched (same container, no restart) and the plugin is not called again.
    wait_for(
        lambda: env.kube.get(path_for("v1", "nodes", name=env.kubelet.node))["status"][
            "conditions"
        ],
        "the node's status",
        10,
    )
    p = env.kube.get(env.pod_path("p"))
    assert p["status"]["phase"] == "Running"
    assert p["status"]["containerStatuses"][0]["restartCount"] == 0
    after = env.kubelet.container(uid, "main")
    assert after is not None and after["containerID"] == before["containerID"]
    assert len(env.plugin.calls_of("NodePrepareResources")) == 1
    # Its own checkpoint carried the claim across the restart.
    assert env.kubelet.claim_infos() == [info]

    env.kube.delete(env.pod_path("p"))
    env.wait_deleted("p")
    assert len(env.plugin.calls_of("NodeUnprepareResources")) == 1
    assert env.kubelet.claim_infos() == []


def test_reboot_prepares_again_and_the_plugin_answers_the_same(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    """A reboot: the kubelet's checkpoint survives, the runtime's containers do not."""
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    pod = env.pod("p", "c")
    env.wait_running("p")
    uid = pod["metadata"]["uid"]
    first = env.kubelet.container(uid, "main")
    assert first is not None

    env.kubelet.stop(signal.SIGKILL)
    # The runtime's state lives in /run on a real node: a reboot takes it all.
    shutil.rmtree(env.kubelet.root / "cri")
    env.kubelet.start()
    prepares = wait_for(
        lambda: (c := env.plugin.calls_of("NodePrepareResources")) and len(c) == 2 and c,
        "the kubelet to prepare the claim again for the new sandbox",
        60,
    )
    assert prepares[0].claims == prepares[1].claims
    second = wait_for(
        lambda: env.kubelet.container(uid, "main"), "the container to be created again", 30
    )
    # The kubelet does not checkpoint that a claim is prepared, so it prepares again.
    # Up to 1.36 it appends the devices a second time (kubernetes/kubernetes#140471,
    # fixed by #140274 in 1.37, whose manager.go resets a driver's devices first): the
    # new container is given each CDI ID twice. Because the plugin answers a repeated
    # prepare exactly as the first, both resolve to the same edits.
    (cdi_id,) = first["cdiDevices"]
    assert second["cdiDevices"] == [cdi_id] * (1 if env.line.minor >= 37 else 2)
    assert sorted(second["env"]) == sorted(first["env"])  # service variables come unordered
    (info,) = env.kubelet.claim_infos()
    assert len(info["DriverState"][DRIVER]["Devices"]) == len(second["cdiDevices"])

    env.kube.delete(env.pod_path("p"))
    env.wait_deleted("p")
    assert len(env.plugin.calls_of("NodeUnprepareResources")) == 1
    assert env.kubelet.claim_infos() == []


def test_pod_deleted_while_the_kubelet_is_down_is_still_unprepared(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    env.wait_running("p")
    env.kubelet.stop(signal.SIGKILL)
    env.kube.delete(env.pod_path("p"))
    env.kubelet.start()
    # A starting kubelet deletes the node's slices and re-discovers the plugin's socket.
    wait_for(lambda: len(env.plugin.registrations) == 2, "a second registration", 30)
    wait_for(lambda: env.slices() == [], "the node's slices wiped at kubelet start", 20)
    # Its checkpoint remembered the prepared claim, so the deletion ends in an unprepare.
    env.wait_deleted("p", timeout=60)
    assert [c.claims for c in env.plugin.calls_of("NodeUnprepareResources")] == [
        [(env.ns, env.claim_uid("c"), "c")]
    ]


def test_unreachable_driver_has_its_slices_deleted(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.kubelet.node, DRIVER, ["dev-0"], cleanup)
    env.plugin.stop()
    # Not at once: the plugin may just be restarting. The kubelet waits 30 s.
    assert env.slices()
    wait_for(lambda: env.slices() == [], "the driver's slices to be deleted", 60)
