"""The kubelet simulator behaves like the kubelet where DRA is concerned: claims shared
by containers and pods, restarts on both sides, unreachable drivers, and every failure
reported where `kubectl describe pod` shows it, while the simulator keeps running."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dradriver.k8s import Kube, path_for
from tests.support.standin import StandinPlugin

from .helpers import RES, KubeletSim, device_class, get_or_none, publish_slice, wait_for

DRIVER = "sim.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"


class Env:
    def __init__(self, kube: Kube, ns: str, sim: KubeletSim, cls: str) -> None:
        self.kube, self.ns, self.sim, self.cls = kube, ns, sim, cls
        self.plugin = StandinPlugin(kube, DRIVER, sim.registry_dir, sim.plugins_dir, sim.cdi_dir)

    def start_plugin(self, **kw: Any) -> StandinPlugin:
        self.plugin = StandinPlugin(
            self.kube, DRIVER, self.sim.registry_dir, self.sim.plugins_dir, self.sim.cdi_dir, **kw
        )
        self.plugin.start()
        assert self.plugin.registered.wait(15), self.sim.log()[-2000:]
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
        def ctr(n: str) -> dict[str, Any]:
            return {"name": n, "image": PAUSE, "resources": {"claims": [{"name": "dev"}]}}

        spec: dict[str, Any] = {
            "nodeSelector": {"kubernetes.io/hostname": self.sim.node},
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            "containers": [ctr(n) for n in containers or ["main"]],
        }
        if init:
            spec["initContainers"] = [ctr(n) for n in init]
        return self.kube.create(
            path_for("v1", "pods", self.ns), {"metadata": {"name": name}, "spec": spec}
        )

    def pod_path(self, name: str) -> str:
        return path_for("v1", "pods", self.ns, name)

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
        return str(self.kube.get(path_for(RES, "resourceclaims", self.ns, name))["metadata"]["uid"])


@pytest.fixture
def env(
    kube: Kube,
    namespace: str,
    kubelet_sim: Callable[..., KubeletSim],
    cleanup: Callable[[str], None],
) -> Iterator[Env]:
    sim = kubelet_sim(extra_args=["--slice-wipe-delay", "2"])
    cls = device_class(kube, DRIVER, cleanup)
    e = Env(kube, namespace, sim, cls)
    yield e
    e.plugin.stop()


def test_containers_and_init_container_share_a_claim(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0", "dev-1"], cleanup)
    env.claim("two", count=2)
    pod = env.pod("p", "two", containers=["a", "b"], init=["setup"])
    running = env.wait_running("p")
    uid = pod["metadata"]["uid"]
    ids = sorted(f"test.dradriver.io/standin={env.claim_uid('two')}-dev-{i}" for i in (0, 1))
    for name in ("setup", "a", "b"):
        rec = env.sim.container(uid, name)
        assert rec is not None, name
        assert sorted(rec["cdiDevices"]) == ids
        assert {"STANDIN_DEVICE_DEV_0=dev-0", "STANDIN_DEVICE_DEV_1=dev-1"} <= set(rec["env"])
    assert env.sim.container(uid, "setup")["init"] is True  # type: ignore[index]
    init_state = running["status"]["initContainerStatuses"][0]["state"]
    assert init_state["terminated"]["reason"] == "Completed"
    assert len(env.plugin.calls_of("NodePrepareResources")) == 1


def test_claim_shared_by_two_pods_is_prepared_once_and_unprepared_after_the_last(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0"], cleanup)
    env.claim("shared")
    env.pod("first", "shared")
    env.wait_running("first")
    env.pod("second", "shared")
    env.wait_running("second")
    claim_uid = env.claim_uid("shared")
    assert [c.claims for c in env.plugin.calls_of("NodePrepareResources")] == [
        [(env.ns, claim_uid, "shared")]
    ]

    env.kube.delete(env.pod_path("first"))
    env.wait_deleted("first")
    assert env.plugin.calls_of("NodeUnprepareResources") == []  # "second" still uses it
    env.kube.delete(env.pod_path("second"))
    env.wait_deleted("second")
    assert [c.claims for c in env.plugin.calls_of("NodeUnprepareResources")] == [
        [(env.ns, claim_uid, "shared")]
    ]


def test_plugin_failure_is_an_event_and_the_pod_starts_once_it_is_fixed(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    # No plugin registered yet: the kubelet says so on the pod.
    ev = wait_for(
        lambda: [e for e in env.events("p") if e["reason"] == "FailedPrepareDynamicResources"],
        "an event",
        60,
    )
    assert f"DRA driver {DRIVER} is not registered" in ev[0]["message"]
    # The container status follows the event (the kubelet writes them separately).
    pod = wait_for(
        lambda: (p := env.kube.get(env.pod_path("p")))["status"].get("containerStatuses") and p,
        "the container status",
        10,
    )
    assert pod["status"]["phase"] == "Pending"
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"

    # The plugin answers with a per-claim error: that text reaches the user.
    env.start_plugin(fail_claims={"c": "GPU gpu-3 is in use by another claim"})
    ev = wait_for(
        lambda: [e for e in env.events("p") if "in use" in e["message"]],
        "the plugin's error as an event",
        30,
    )
    assert ev[0]["type"] == "Warning"
    assert f"driver {DRIVER} failed to prepare claim {env.ns}/c" in ev[0]["message"]
    # Fixed: the retry with backoff succeeds without anyone touching the pod.
    env.plugin.fail_claims.clear()
    env.wait_running("p", timeout=60)
    assert env.sim.alive()


def test_unresolvable_cdi_device_fails_the_container_with_the_reason(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin(bogus_cdi_id="test.dradriver.io/standin=no-such-device")
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    ev = wait_for(
        lambda: [e for e in env.events("p") if e["reason"] == "Failed"], "a Failed event", 30
    )
    assert "unresolvable CDI devices test.dradriver.io/standin=no-such-device" in ev[0]["message"]
    pod = env.kube.get(env.pod_path("p"))
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError"
    assert "no-such-device" in waiting["message"]
    # Deleting the failed pod still unprepares the claim: nothing leaks.
    env.kube.delete(env.pod_path("p"))
    env.wait_deleted("p")
    assert len(env.plugin.calls_of("NodeUnprepareResources")) == 1
    assert env.sim.alive()


def test_simulator_restart_reregisters_and_still_unprepares(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0"], cleanup)
    env.claim("c")
    env.pod("p", "c")
    env.wait_running("p")
    env.sim.stop(signal.SIGKILL)
    # The pod goes away while the kubelet is down.
    env.kube.delete(env.pod_path("p"))
    env.sim.start()
    # A starting kubelet deletes the node's slices and re-discovers the plugin's socket.
    wait_for(lambda: len(env.plugin.registrations) == 2, "a second registration", 20)
    assert env.plugin.registrations == [(True, ""), (True, "")]
    slices = env.kube.list(
        path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={env.sim.node}"
    )["items"]
    assert slices == []
    # It remembered the prepared claim, so the pod deletion completes with an unprepare.
    env.wait_deleted("p")
    assert [c.claims for c in env.plugin.calls_of("NodeUnprepareResources")] == [
        [(env.ns, env.claim_uid("c"), "c")]
    ]


def test_unreachable_driver_has_its_slices_deleted(
    env: Env, cleanup: Callable[[str], None]
) -> None:
    env.start_plugin()
    publish_slice(env.kube, env.sim.node, DRIVER, ["dev-0"], cleanup)
    env.plugin.stop()

    def slices() -> list[Any]:
        return list(
            env.kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={env.sim.node}"
            )["items"]
        )

    assert slices()  # not at once: the plugin may just be restarting
    wait_for(lambda: slices() == [], "the driver's slices to be deleted", 15)
    assert "deleting the driver's slices" in env.sim.log()
