"""End-to-end smoke test using only real components: the real controller-manager
creates the claim from its template, the real scheduler allocates it and binds the pod,
the real kubelet (a hollow node) prepares it through a DRA plugin over real Unix
sockets, the runtime resolves the plugin's CDI device into the container, and deleting
the pod unprepares the claim."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dradriver.k8s import Kube, path_for
from tests.support.standin import StandinPlugin

from .helpers import HollowNode, device_class, get_or_none, publish_slice, wait_for

RES = "resource.k8s.io/v1"


def pod_with_template(
    kube: Kube, ns: str, cls: str, node_selector: dict[str, str]
) -> dict[str, Any]:
    kube.create(
        path_for(RES, "resourceclaimtemplates", ns),
        {
            "apiVersion": RES,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-device"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "dev", "exactly": {"deviceClassName": cls, "count": 1}}
                        ]
                    }
                }
            },
        },
    )
    return kube.create(
        path_for("v1", "pods", ns),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "smoke"},
            "spec": {
                "nodeSelector": node_selector,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-device"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "env": [{"name": "FROM_SPEC", "value": "1"}],
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        },
    )


def test_pod_claim_is_allocated_by_the_scheduler_and_prepared_by_the_kubelet(
    kube: Kube,
    namespace: str,
    hollow_node: Callable[..., HollowNode],
    cleanup: Callable[[str], None],
) -> None:
    kubelet = hollow_node()
    driver = "smoke.dradriver.io"
    plugin = StandinPlugin(kube, driver, kubelet.registry_dir, kubelet.plugins_dir, kubelet.cdi_dir)
    plugin.start()
    try:
        assert plugin.registered.wait(15), f"not registered; kubelet log:\n{kubelet.log()[-2000:]}"
        assert plugin.registrations == [(True, "")]
        publish_slice(kube, kubelet.node, driver, ["dev-0", "dev-1"], cleanup)
        cls = device_class(kube, driver, cleanup)
        pod = pod_with_template(kube, namespace, cls, {"kubernetes.io/hostname": kubelet.node})
        pod_path = path_for("v1", "pods", namespace, name="smoke")

        running = wait_for(
            lambda: (
                (p := get_or_none(kube, pod_path))
                and p.get("status", {}).get("phase") == "Running"
                and p
            ),
            "the pod to run",
            timeout=60,
        )
        assert running["spec"]["nodeName"] == kubelet.node

        # The controller-manager made the claim from the template, for this pod.
        statuses = running["status"]["resourceClaimStatuses"]
        assert [s["name"] for s in statuses] == ["dev"]
        claim_name = statuses[0]["resourceClaimName"]
        claim = kube.get(path_for(RES, "resourceclaims", namespace, name=claim_name))
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        # The scheduler, not the test, allocated it and reserved it for the pod.
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1
        assert results[0]["driver"] == driver and results[0]["pool"] == kubelet.node
        assert results[0]["device"] in ("dev-0", "dev-1")
        writers = {
            m["manager"]
            for m in claim["metadata"]["managedFields"]
            if m.get("subresource") == "status"
        }
        assert "kube-scheduler" in writers, writers
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": "smoke", "uid": pod["metadata"]["uid"]}
        ]

        # The plugin got exactly this claim, once, with the protocol's three fields.
        prepares = plugin.calls_of("NodePrepareResources")
        assert [(c.version, c.claims) for c in prepares] == [
            ("v1", [(namespace, claim["metadata"]["uid"], claim_name)])
        ]

        # The container got the CDI edits the plugin returned, on top of its own env.
        device = results[0]["device"]
        rec = kubelet.container(pod["metadata"]["uid"], "main")
        assert rec is not None
        dev_env = f"STANDIN_DEVICE_{device.upper().replace('-', '_')}={device}"
        # The CDI edits come after the container's own env (the pod's, then the kubelet's
        # service variables), as the OCI spec a runtime writes would hold them.
        assert rec["env"][-2:] == [dev_env, f"STANDIN_CLAIM={namespace}/{claim_name}"]
        assert rec["env"][0] == "FROM_SPEC=1"
        assert "KUBERNETES_SERVICE_HOST=10.96.0.1" in rec["env"]
        assert rec["cdiDevices"] == [
            f"test.dradriver.io/standin={claim['metadata']['uid']}-{device}"
        ]

        # Deleting the pod unprepares the claim, then the pod object goes away.
        kube.delete(pod_path)
        wait_for(lambda: get_or_none(kube, pod_path) is None, "the pod to be deleted", 30)
        unprepares = plugin.calls_of("NodeUnprepareResources")
        assert [c.claims for c in unprepares] == [
            [(namespace, claim["metadata"]["uid"], claim_name)]
        ]
        assert not list(kubelet.cdi_dir.glob("standin-*.json"))
        assert kubelet.container(pod["metadata"]["uid"], "main") is None
        assert kubelet.claim_infos() == []  # the kubelet's own checkpoint lets it go
    finally:
        plugin.stop()
