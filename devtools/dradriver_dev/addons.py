"""What `dradriver dev cluster up` adds to the bare control plane, so that it answers as a
cluster with the chart installed does: the driver's DeviceClasses and the ComputeDomain
CRD always, and with --webhook `dradriver controller` (the admission webhook and the
ComputeDomain controller) as a process on loopback.

The webhook process is recorded in cluster.json beside the control plane's, so
`dradriver dev cluster down` (`make cluster-down`) stops it with them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.k8s import Kube, KubeError, path_for
from dradriver_dev import cluster, ports

DEVICE_CLASSES = cluster.REPO_ROOT / "deploy" / "deviceclasses.yaml"
CRDS = cluster.REPO_ROOT / "deploy" / "helm" / "dradriver" / "crds"
CRD_API = "apiextensions.k8s.io/v1"
FIELD_MANAGER = "dradriver-dev"
ADM = "admissionregistration.k8s.io/v1"
RES = "resource.k8s.io/v1"
# The chart's default names, so that what one sees here is what a real cluster shows.
WEBHOOK_CONFIG = "dradriver-admission"
WEBHOOK_PROCESS = cluster.WEBHOOK_PROCESS
WEBHOOK_NAME = f"resourceclaims.{DEFAULT_DRIVER_NAME}"
# A config the webhook refuses: the probe that tells it is in effect, and the demo's example.
BAD_STRATEGY = "Spatial"
BAD_PARAMETERS: dict[str, Any] = {
    "apiVersion": "gpu.dradriver.io/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": BAD_STRATEGY},
}


def device_classes() -> list[dict[str, Any]]:
    """deploy/deviceclasses.yaml: the chart's classes for its default values (a chart test
    holds the two equal), readable without helm, which `make cluster-up` does not build."""
    return [d for d in yaml.safe_load_all(DEVICE_CLASSES.read_text()) if d]


def apply_device_classes(kube: Kube) -> list[str]:
    """Server-side apply: idempotent, and a class edited since is put back as shipped."""
    names = []
    for doc in device_classes():
        name = doc["metadata"]["name"]
        path = path_for(doc["apiVersion"], "deviceclasses", name=name)
        kube.apply(path, doc, field_manager=FIELD_MANAGER)
        names.append(name)
    return names


def crds() -> list[dict[str, Any]]:
    """The chart's CRDs (crds/: plain YAML, as Helm requires there)."""
    return [d for f in sorted(CRDS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def crd_names() -> list[str]:
    return [d["metadata"]["name"] for d in crds()]


def apply_crds(kube: Kube, deadline: float) -> list[str]:
    """The chart's CRDs, applied and waited for until the API server serves them."""
    return establish(kube, crds(), deadline)


def establish(kube: Kube, docs: list[dict[str, Any]], deadline: float) -> list[str]:
    """CRDs applied server-side (a big one, Kueue's Workload at 1.4 MB, is over what a
    client-side apply's last-applied annotation may hold), then waited for until the API
    server serves them; raises ClusterError past `deadline`."""
    names = []
    for doc in docs:
        name = doc["metadata"]["name"]
        kube.apply(
            path_for(CRD_API, "customresourcedefinitions", name=name),
            doc,
            field_manager=FIELD_MANAGER,
        )
        names.append(name)
    for name in names:
        path = path_for(CRD_API, "customresourcedefinitions", name=name)
        while not any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (kube.get(path).get("status") or {}).get("conditions") or []
        ):
            if time.monotonic() > deadline:
                raise cluster.ClusterError(f"CRD {name} is not established yet")
            time.sleep(0.1)
    return names


def webhook_configuration(port: int) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration (templates/controller.yaml), the webhook
    reached by URL on loopback instead of through a Service: the API server runs here.
    No caBundle: the controller makes its CA at startup and patches it in."""
    return {
        "apiVersion": ADM,
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate"},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                        "scope": "Namespaced",
                    }
                ],
                # As in the chart: only claims with a config for this driver wait on the
                # webhook, and metadata-only updates (finalizers) never do.
                "matchConditions": [
                    {
                        "name": "spec-written",
                        "expression": 'request.operation == "CREATE" || '
                        "object.spec != oldObject.spec",
                    },
                    {
                        "name": "has-driver-config",
                        "expression": '(request.resource.resource == "resourceclaims" ? '
                        "object.spec : object.spec.spec).?devices.?config.orValue([])"
                        ".exists(c, has(c.opaque) && "
                        f'c.opaque.driver == "{DEFAULT_DRIVER_NAME}")',
                    },
                ],
            }
        ],
    }


def bad_claim(name: str) -> dict[str, Any]:
    """A ResourceClaim whose config for this driver names a sharing strategy that does
    not exist: what the webhook is there to refuse."""
    return {
        "apiVersion": RES,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME}}],
                "config": [
                    {"opaque": {"driver": DEFAULT_DRIVER_NAME, "parameters": BAD_PARAMETERS}}
                ],
            }
        },
    }


def _refusal(kube: Kube) -> str:
    """The webhook's refusal of a dry-run bad claim; '' while the API server does not
    call it yet with its CA (it takes up configuration changes within a moment)."""
    try:
        kube.request(
            "POST",
            path_for(RES, "resourceclaims", "default"),
            body=bad_claim("webhook-probe"),
            query={"dryRun": "All"},
        )
    except KubeError as exc:
        return exc.message if "denied the request" in exc.message else ""
    return ""


def start_webhook(kube: Kube, st: cluster.ClusterState, deadline: float) -> None:
    """Starts `dradriver controller` against the cluster and returns once the API server
    refuses a bad claim through it."""
    logs = Path(st.state_dir) / "logs"
    port, healthz_port = ports.free_ports(2)
    config = path_for(ADM, "validatingwebhookconfigurations", name=WEBHOOK_CONFIG)
    kube.apply(config, webhook_configuration(port), field_manager=FIELD_MANAGER)
    st.pids[WEBHOOK_PROCESS] = cluster._start(
        WEBHOOK_PROCESS,
        [
            sys.executable,
            "-m",
            "dradriver.cli",
            "controller",
            f"--kubeconfig={st.kubeconfig}",
            "--webhook-address=127.0.0.1",
            f"--webhook-port={port}",
            f"--healthz-port={healthz_port}",
            f"--webhook-config-name={WEBHOOK_CONFIG}",
            "--failure-policy=Fail",
            # Its leader-election Lease: the chart's namespace does not exist here.
            "--namespace=default",
        ],
        logs,
    )
    st.ports["webhook"], st.ports["webhook-healthz"] = port, healthz_port
    st.save()  # recorded before waiting, so `down` stops it whatever happens next
    cluster._wait_http(
        WEBHOOK_PROCESS,
        f"http://127.0.0.1:{healthz_port}/readyz",
        st.pids[WEBHOOK_PROCESS],
        logs,
        deadline,
    )
    while not _refusal(kube):
        if time.monotonic() > deadline:
            raise cluster.ClusterError(
                "the API server does not call the admission webhook yet; see "
                f"{logs / WEBHOOK_PROCESS}.log"
            )
        time.sleep(0.2)


def install(st: cluster.ClusterState, *, webhook: bool, deadline: float) -> None:
    """Applies the DeviceClasses and CRDs and, if asked, makes sure the controller runs
    (the webhook and the ComputeDomain controller). Idempotent:
    run on a cluster that has them, it changes nothing."""
    kube = Kube.from_kubeconfig(st.kubeconfig)
    try:
        apply_device_classes(kube)
        apply_crds(kube, deadline)
        pid = st.pids.get(WEBHOOK_PROCESS)
        if pid is not None and not cluster._alive(pid):
            del st.pids[WEBHOOK_PROCESS]
            st.ports.pop("webhook", None)
            st.ports.pop("webhook-healthz", None)
            st.save()
            if not webhook:
                # Under failurePolicy Fail a webhook nobody serves refuses every claim
                # with a config for the driver: without --webhook, take it away.
                kube.delete(
                    path_for(ADM, "validatingwebhookconfigurations", name=WEBHOOK_CONFIG),
                    missing_ok=True,
                )
        if webhook and WEBHOOK_PROCESS not in st.pids:
            start_webhook(kube, st, deadline)
    except KubeError as exc:
        raise cluster.ClusterError(f"setting up the cluster's add-ons failed: {exc}") from exc
    finally:
        kube.close()
