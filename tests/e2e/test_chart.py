"""The Helm chart (P6): it lints and renders, the API server accepts what it renders, and
the plugin and the controller work with nothing but the chart's RBAC, while the
admission policy keeps the plugin to its own node's ResourceSlices.

One release is rendered and applied for the whole module, in a namespace of its own.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver import cli
from dradriver.k8s import Kube, KubeError, NotFound, path_for
from dradriver.k8s.lines import LINES, NEWEST

from .helpers import (
    HOST_IMAGE,
    REPO,
    RES,
    Cluster,
    HelmError,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    apply_object,
    free_port,
    get_or_none,
    load_yaml,
    new_namespace,
    request_token,
    resource_path,
    run_helm,
    token_kubeconfig,
    wait_for,
)

CHART = REPO / "deploy" / "helm" / "dradriver"
RELEASE = "dradriver"
KUBE_VERSION = "v1.34.4"
# What kind runs (deploy/kind/cluster.yaml): the newest line, whose defaults the kind
# values rely on.
KIND_KUBE_VERSION = NEWEST.release
DRIVER = "gpu.dradriver.io"
PAUSE = "registry.k8s.io/pause:3.10"
POLICY_SAYS = "may only create, update and delete ResourceSlices whose spec.nodeName is the node"
# No kubelet runs the chart's pods here: keep the DaemonSet and the Deployment off the
# hollow nodes, which should see only the pods the tests create.
INERT = {"nodeSelector": {"dradriver.io/e2e": "never"}}
TEST_VALUES: dict[str, Any] = {
    "devices": "fake:2xH100-80GB",
    # The image of the plugin's daemon pods, which the daemon-pod policy holds them to:
    # the one the hollow nodes run as host processes, as the test plugins' --daemon-image.
    "image": {"repository": HOST_IMAGE.split(":")[0], "tag": HOST_IMAGE.split(":")[1]},
    # Where the plugins of these tests keep their state (a daemon pod's host paths must
    # be under stateDir).
    "stateDir": str(Path(tempfile.gettempdir()) / "dradriver-e2e-chart"),
    # The node label is granted (and its policy rendered) only where a plugin labels.
    "kubeletPlugin": {**INERT, "nvlinkDomainLabel": True},
    # The webhook's Service has no endpoints here; Ignore keeps claims in other tests
    # of this module admissible whatever they carry. The NetworkPolicy is applied for the
    # API server to check it.
    "controller": {
        **INERT,
        "failurePolicy": "Ignore",
        "networkPolicy": {"enabled": True},
        "fleetMetrics": {"enabled": True, "period": 1, "page": True},
    },
}


def render(
    helm: Path,
    values: dict[str, Any] | None = None,
    namespace: str = "gpu-system",
    release: str = RELEASE,
    kube_version: str = KUBE_VERSION,
) -> list[dict[str, Any]]:
    out = run_helm(
        helm,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
        values=values or {},
    )
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, f"{len(found)} {kind} ({component}) rendered"
    return found[0]


def flags(container: dict[str, Any]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in container["command"] if a.startswith("--"))


def check_references(docs: list[dict[str, Any]], ns: str) -> None:
    """Every name one object uses to find another is the other's name: the peer driver's
    policy named a ServiceAccount its DaemonSet did not run as, and so never applied."""
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for d in docs:
        if d["kind"] in ("ServiceAccount", "DaemonSet", "Deployment", "Service"):
            assert d["metadata"]["namespace"] == ns, d["metadata"]
    # One DaemonSet, or one per node group: each runs as the plugin's ServiceAccount (the
    # RBAC and the admission policies name it) and selects only its own pods.
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    assert daemonsets
    (plugin_sa,) = {ds["spec"]["template"]["spec"]["serviceAccountName"] for ds in daemonsets}
    assert ("ServiceAccount", plugin_sa) in names
    for ds in daemonsets:
        assert ds["spec"]["selector"]["matchLabels"].items() <= (
            ds["spec"]["template"]["metadata"]["labels"].items()
        )
        for other in daemonsets:
            if other is not ds:
                assert not other["spec"]["selector"]["matchLabels"].items() <= (
                    ds["spec"]["template"]["metadata"]["labels"].items()
                ), "two DaemonSets select the same pods"
    for component, sa in (("kubelet-plugin", plugin_sa), ("controller", None)):
        crb = one(docs, "ClusterRoleBinding", component)
        assert ("ClusterRole", crb["roleRef"]["name"]) in names
        subject = crb["subjects"][0]
        assert ("ServiceAccount", subject["name"]) in names and subject["namespace"] == ns
        if sa:
            assert subject["name"] == sa
    vaps = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    # Own node's slices, own node's claims' status, own node's daemon pods and, where it
    # labels, own node's clique label (the plugin); its own webhook's caBundle only, and
    # with ComputeDomains its domains' templates only (the controller).
    assert 4 <= len(vaps) <= 6
    ctrl_sa = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    for vap in vaps:
        (cond,) = vap["spec"]["matchConditions"]
        component = vap["metadata"]["labels"].get("app.kubernetes.io/component")
        sa = ctrl_sa if component == "controller" else plugin_sa
        assert cond["expression"] == (
            f'request.userInfo.username == "system:serviceaccount:{ns}:{sa}"'
        )
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(
        v["metadata"]["name"] for v in vaps
    )
    dep = one(docs, "Deployment")
    ctrl = dep["spec"]["template"]["spec"]
    assert ("ServiceAccount", ctrl["serviceAccountName"]) in names
    ctrl_crb = one(docs, "ClusterRoleBinding", "controller")
    assert ctrl_crb["subjects"][0]["name"] == ctrl["serviceAccountName"]
    f = flags(ctrl["containers"][0])
    vwc = one(docs, "ValidatingWebhookConfiguration")
    svc = one(docs, "Service")
    assert f["webhook-config-name"] == vwc["metadata"]["name"]
    rule, *domains = one(docs, "ClusterRole", "controller")["rules"]
    assert rule["resourceNames"] == [vwc["metadata"]["name"]]
    # ComputeDomains: what the controller reads and writes, and its Lease (namespaced).
    if f["compute-domains"] == "on":
        granted = {
            (g, r, v)
            for d in domains
            for g in d["apiGroups"]
            for r in d["resources"]
            for v in d["verbs"]
        }
        assert ("gpu.dradriver.io", "computedomains/status", "update") in granted
        assert ("resource.k8s.io", "resourceclaimtemplates", "create") in granted
        assert ("resource.k8s.io", "resourceclaims", "watch") in granted
        role = one(docs, "Role", "controller")
        assert role["metadata"]["namespace"] == ns
        assert role["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]
        binding = one(docs, "RoleBinding", "controller")
        assert binding["subjects"][0]["name"] == ctrl["serviceAccountName"]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        classes = [d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"]
        assert f["channel-device-class"] in classes
    else:
        controller_roles = [
            d
            for d in docs
            if d["kind"] == "Role"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"
        ]
        assert domains == [] and controller_roles == []
    assert f["service-name"] == svc["metadata"]["name"]
    assert f["failure-policy"] == vwc["webhooks"][0]["failurePolicy"]
    ref = vwc["webhooks"][0]["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"]) == (svc["metadata"]["name"], ns)
    assert ref["path"] == "/validate"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_chart_lints_and_renders_consistent_names(helm: Path) -> None:
    run_helm(helm, "lint", "--strict", str(CHART))
    # What `make kind-demo` installs.
    kind_values: dict[str, Any] = yaml.safe_load(
        (REPO / "deploy" / "kind" / "values.yaml").read_text()
    )
    run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        KIND_KUBE_VERSION,
        values=kind_values,
    )
    for release, ns, values in (
        ("dradriver", "gpu-system", {}),
        ("gpus", "kube-system", {}),
        ("dradriver", "x", {"fullnameOverride": "acme"}),
        ("dradriver", "x", {"computeDomains": {"enabled": False}}),
    ):
        check_references(render(helm, values, ns, release), ns)
    kind = render(helm, kind_values, "x", "dradriver", kube_version=KIND_KUBE_VERSION)
    check_references(kind, "x")
    docs = render(helm)
    # The CRD ships in crds/, which Helm installs before the templates.
    crds = run_helm(helm, "template", RELEASE, str(CHART), "--include-crds", values={})
    assert "name: computedomains.gpu.dradriver.io" in crds
    # The defaults give the names the controller and the docs use.
    assert one(docs, "DaemonSet")["metadata"]["name"] == "dradriver-kubelet-plugin"
    assert one(docs, "ValidatingWebhookConfiguration")["metadata"]["name"] == "dradriver-admission"
    assert one(docs, "Service")["metadata"]["name"] == "dradriver-controller"
    # deploy/deviceclasses.yaml (what ensure_device_classes applies) is the chart's.
    rendered = {
        d["metadata"]["name"]: " ".join(d["spec"]["selectors"][0]["cel"]["expression"].split())
        for d in docs
        if d["kind"] == "DeviceClass"
    }
    static = {
        d["metadata"]["name"]: " ".join(d["spec"]["selectors"][0]["cel"]["expression"].split())
        for d in load_yaml(REPO / "deploy" / "deviceclasses.yaml")
    }
    assert rendered == static
    assert not [d for d in docs if d["kind"] == "DeviceClass" and "extendedResourceName" in d]
    # The nvml flavour takes only libnvidia-ml.so.1 from the driver root.
    plugin = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    assert env["LD_LIBRARY_PATH"] == "/run/dradriver/lib"
    assert plugin["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "readOnlyRootFilesystem": True,
    }
    ctrl = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert ctrl["securityContext"]["runAsNonRoot"] is True
    assert ctrl["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    legacy = {"devices": "fake:2xL4", "driverFiles": "runtime"}
    fake = one(render(helm, legacy), "DaemonSet")["spec"]["template"]["spec"]
    assert fake["containers"][0]["command"] == ["dradriver", "kubelet-plugin"]
    assert "driver-root" not in {v["name"] for v in fake["volumes"]}


def test_chart_refuses_settings_the_api_server_would_silently_drop(helm: Path) -> None:
    with pytest.raises(HelmError, match="DRAPartitionableDevices"):
        render(helm, {"migMode": "dynamic"})
    with pytest.raises(HelmError, match="DRAExtendedResource"):
        render(helm, {"extendedResourceClass": {"enabled": True}})
    with pytest.raises(HelmError, match="migMode"):
        render(helm, {"migMode": "sometimes"})
    with pytest.raises(HelmError, match="kubeVersion"):
        render(helm, kube_version="v1.33.5")
    ext = render(
        helm,
        {"extendedResourceClass": {"enabled": True}, "featureGates": {"DRAExtendedResource": True}},
    )
    (cls,) = [d for d in ext if d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]]
    assert cls["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    # Without --kube-version helm assumes the Kubernetes it was built against (>= 1.34).
    run_helm(helm, "template", RELEASE, str(CHART))
    # Unset, a gate is what the cluster's line has by default: on from 1.36, where the
    # same values need no featureGates at all; set false, it is refused there too.
    for line in ("v1.35.4", "v1.36.3", "v1.37.2"):
        for values in ({"migMode": "dynamic"}, {"extendedResourceClass": {"enabled": True}}):
            if line == "v1.35.4":
                with pytest.raises(HelmError, match=r"off by default on Kubernetes 1\.34"):
                    render(helm, values, kube_version=line)
            else:
                assert render(helm, values, kube_version=line)
    with pytest.raises(HelmError, match="DRAPartitionableDevices"):
        off = {"DRAPartitionableDevices": False}
        render(helm, {"migMode": "dynamic", "featureGates": off}, kube_version="v1.37.2")


@dataclass
class Release:
    ns: str
    docs: list[dict[str, Any]]

    def named(self, kind: str, component: str | None = None) -> str:
        return str(one(self.docs, kind, component)["metadata"]["name"])

    @property
    def plugin_sa(self) -> str:
        return self.named("ServiceAccount", "kubelet-plugin")

    @property
    def controller_sa(self) -> str:
        return self.named("ServiceAccount", "controller")


@pytest.fixture(scope="module")
def release(helm: Path, kube: Kube) -> Iterator[Release]:
    ns = f"dradriver-{secrets.token_hex(3)}"
    kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    docs = render(helm, TEST_VALUES, ns)
    try:
        for doc in docs:
            apply_object(kube, doc)
        yield Release(ns, docs)
    finally:
        uninstall(kube, docs, ns)


def uninstall(kube: Kube, docs: list[dict[str, Any]], ns: str) -> None:
    """Deletes what the release made outside its namespace (cluster-wide objects, the
    node-events Role in default), then the namespace with the rest."""
    for doc in reversed(docs):
        # The DeviceClasses are the same ones the other e2e tests use: leave them.
        if doc["kind"] != "DeviceClass" and doc["metadata"].get("namespace") != ns:
            with contextlib.suppress(KubeError):
                kube.delete(resource_path(kube, doc), missing_ok=True)
    kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def test_rendered_objects_are_accepted_by_the_api_server(kube: Kube, release: Release) -> None:
    for doc in release.docs:
        stored = kube.get(resource_path(kube, doc))
        assert stored["metadata"]["name"] == doc["metadata"]["name"]
    # The API server type-checks each policy's CEL against the schema it matches.
    for doc in release.docs:
        if doc["kind"] != "ValidatingAdmissionPolicy":
            continue
        vap = path_for(
            "admissionregistration.k8s.io/v1",
            "validatingadmissionpolicies",
            name=doc["metadata"]["name"],
        )
        status = wait_for(
            lambda vap=vap: (
                kube.get(vap).get("status", {}).get("observedGeneration") and kube.get(vap)
            ),
            "the policy's type check",
            15,
        )["status"]
        assert not status.get("typeChecking", {}).get("expressionWarnings"), status
        assert not status.get("conditions") or all(
            c["status"] == "True" for c in status["conditions"]
        )


def rules(role: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {k: sorted(v) for k, v in r.items() if k in ("apiGroups", "resources", "verbs")}
        for r in role["rules"]
    ]


def plugin_calls(*, compute_domains: bool, imex: bool, node_label: bool) -> list[dict[str, Any]]:
    """The plugin's API calls in a mode, each with the code that makes it: what its
    ClusterRole must grant, exactly."""

    def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}

    return [
        # slices/publish.py (its Node's UID as the slices' owner), device_view/health.py.
        rule("", "nodes", "get"),
        # device_view/node_label.py, only where the plugin labels its Node.
        *([rule("", "nodes", "patch")] if node_label else []),
        # slices/publish.py: list and watch its node's slices, create, replace, delete.
        rule("resource.k8s.io", "resourceslices", "create", "delete", "list", "update", "watch"),
        # prepare/claim_devices.py reads the claim the kubelet names.
        rule("resource.k8s.io", "resourceclaims", "get"),
        # prepare/channels.py reads an IMEX channel's ComputeDomain.
        *([rule("gpu.dradriver.io", "computedomains", "get")] if compute_domains else []),
        # imex_binding/binder.py watches the claims made from domain templates.
        *([rule("resource.k8s.io", "resourceclaims", "list", "watch")] if imex else []),
        # `dradriver doctor` in the plugin pod reads the DeviceClasses.
        rule("resource.k8s.io", "deviceclasses", "list"),
        # prepare/claim_status.py: status.devices by server-side apply, and from 1.36 the
        # synthetic subresource for its own node's claims (resourceNames: its driver).
        rule("resource.k8s.io", "resourceclaims/status", "patch"),
        rule("resource.k8s.io", "resourceclaims/driver", "associated-node:patch"),
    ]


# Each mode the chart grants differently in: ComputeDomains off, on without IMEX (the
# default), IMEX on everywhere or in one node group, and the node label asked for or
# refused whatever IMEX says.
MODES: dict[str, tuple[dict[str, Any], dict[str, bool]]] = {
    "no-domains": (
        {"computeDomains": {"enabled": False}},
        {"compute_domains": False, "imex": False, "node_label": False},
    ),
    "default": ({}, {"compute_domains": True, "imex": False, "node_label": False}),
    "imex": (
        {"computeDomains": {"imexChannels": True}},
        {"compute_domains": True, "imex": True, "node_label": True},
    ),
    "imex-group": (
        {
            "nodeGroups": [
                {"name": "gb200", "nodeSelector": {"gpu": "gb200"}, "imexChannels": True},
                {"name": "h100", "nodeSelector": {"gpu": "h100"}},
            ]
        },
        {"compute_domains": True, "imex": True, "node_label": True},
    ),
    "label-without-imex": (
        {"kubeletPlugin": {"nvlinkDomainLabel": True}},
        {"compute_domains": True, "imex": False, "node_label": True},
    ),
    "imex-without-label": (
        {"computeDomains": {"imexChannels": True}, "kubeletPlugin": {"nvlinkDomainLabel": False}},
        {"compute_domains": True, "imex": True, "node_label": False},
    ),
    "fleet-metrics": (
        {"controller": {"fleetMetrics": {"enabled": True}}},
        {"compute_domains": True, "imex": False, "node_label": False},
    ),
}


@pytest.mark.parametrize("line", [line.release for line in LINES])
@pytest.mark.parametrize("mode", MODES)
def test_grants_are_exactly_what_the_code_calls(helm: Path, mode: str, line: str) -> None:
    """The RBAC rendered in every mode for every line (rendering needs no API server, so
    this runs once, not per line): any added verb must come with the code that needs it
    (and the report of why), and a grant a mode does not use is not made."""
    values, calls = MODES[mode]
    docs = render(helm, values, kube_version=line)
    assert rules(one(docs, "ClusterRole", "kubelet-plugin")) == plugin_calls(**calls)
    daemonsets = [d for d in docs if d["kind"] == "DaemonSet"]
    labels = {
        e["value"]
        for ds in daemonsets
        for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "DRADRIVER_NVLINK_DOMAIN_LABEL"
    }
    # A plugin labels its Node only where it may (imex-group: the GB200 group only).
    assert labels == (
        {"on", "off"} if mode == "imex-group" else {"on" if calls["node_label"] else "off"}
    )
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert (f"{RELEASE}-node-label-own-node" in policies) == calls["node_label"]
    # health.py's node Event: in default, where Node events go, and nowhere else.
    events, daemonset_reader = sorted(
        (d for d in docs if d["kind"] == "Role" and "kubelet-plugin" in d["metadata"]["name"]),
        key=lambda d: d["metadata"]["name"] != f"{RELEASE}-kubelet-plugin-node-events",
    )
    assert events["metadata"]["namespace"] == "default"
    assert rules(events) == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    # uninstall.py reads its own DaemonSets at stop: deleted means uninstalled.
    assert daemonset_reader["metadata"]["namespace"] == "gpu-system"
    assert daemonset_reader["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": [d["metadata"]["name"] for d in daemonsets],
            "verbs": ["get"],
        },
        # daemons/pods.py: the MPS and IMEX daemons' pods, in its own namespace only
        # (daemon-pod-policy.yaml keeps them to its node and their shape).
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
    ]
    assert f"{RELEASE}-daemon-pods-own-node" in policies
    ctrl = one(docs, "ClusterRole", "controller")
    domains = calls["compute_domains"]
    assert ctrl["rules"] == [
        # controller/cabundle.py keeps its CA in its own webhook configuration.
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": [f"{RELEASE}-admission"],
            "verbs": ["list", "watch", "patch"],
        },
        # controller/computedomain/: the domains (their finalizer), their status, the
        # templates it makes and deletes (the template policy narrows them), the claims
        # made from them and the slices it places by, the member nodes' addresses.
        *(
            [
                {
                    "apiGroups": ["gpu.dradriver.io"],
                    "resources": ["computedomains"],
                    "verbs": ["get", "list", "watch", "patch"],
                },
                {
                    "apiGroups": ["gpu.dradriver.io"],
                    "resources": ["computedomains/status"],
                    "verbs": ["update"],
                },
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaimtemplates"],
                    "verbs": ["get", "list", "watch", "create", "delete"],
                },
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims", "resourceslices"],
                    "verbs": ["list", "watch"],
                },
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            ]
            if domains
            else []
        ),
        # controller/fleet.py mirrors what `dradriver fleet` reads (controller.fleetMetrics).
        *(
            [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceslices", "resourceclaims", "deviceclasses"],
                    "verbs": ["list", "watch"],
                },
                {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]},
            ]
            if mode == "fleet-metrics"
            else []
        ),
    ]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ("--fleet-metrics=on" in args) == (mode == "fleet-metrics")
    assert (f"{RELEASE}-controller-domain-templates-only" in policies) == domains


def test_the_installed_rbac_is_the_rendered(kube: Kube, release: Release) -> None:
    """What the API server keeps is what was rendered (no aggregation or defaulting
    widens it)."""
    for doc in release.docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            stored = kube.get(resource_path(kube, doc))
            assert rules(stored) == rules(doc), doc["metadata"]["name"]


def sa_pod(kube: Kube, ns: str, name: str, sa: str, node: str | None = None) -> dict[str, Any]:
    """The pod a token is bound to, as the kubelet binds a mounted token to its pod."""
    spec: dict[str, Any] = {
        "serviceAccountName": sa,
        "containers": [{"name": "c", "image": PAUSE}],
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = INERT["nodeSelector"]
    return kube.create(path_for("v1", "pods", ns), {"metadata": {"name": name}, "spec": spec})


def status_of(fn: Callable[[], object]) -> int:
    try:
        fn()
    except KubeError as exc:
        return exc.status
    return 200


def test_plugin_works_with_only_the_chart_rbac(
    cluster: Cluster,
    kube: Kube,
    release: Release,
    namespace: str,
    hollow_node: Callable[..., HollowNode],
) -> None:
    kubelet = hollow_node()
    pod = sa_pod(kube, release.ns, f"plugin-{kubelet.node}", release.plugin_sa, kubelet.node)
    token = request_token(kube, release.ns, release.plugin_sa, pod)
    kcfg = token_kubeconfig(
        cluster.kubeconfig, token, kubelet.root.parent / f"{kubelet.node}.kubeconfig"
    )
    # A slice an older plugin left behind: publishing must delete it.
    stale = kube.create(
        path_for(RES, "resourceslices"), slice_body(f"{kubelet.node}-old", kubelet.node)
    )
    stale_path = path_for(RES, "resourceslices", name=stale["metadata"]["name"])
    # The chart's own DaemonSet (rendered with no node to run on) as its owner: at stop
    # the plugin reads it with the chart's Role.
    owner = f"{release.ns}/{release.named('DaemonSet')}"
    args = ["--owner-daemonset", owner, "--daemon-namespace", release.ns]
    plugin = PluginProc(kcfg, kubelet, "fake:2xH100-80GB", extra_args=args)
    plugin.start()
    try:
        wait_for(plugin.ready, "the plugin to be ready as its ServiceAccount", 30)
        assert get_or_none(kube, stale_path) is None
        slices = path_for(RES, "resourceslices")
        (s,) = kube.list(slices, fieldSelector=f"spec.nodeName={kubelet.node}")["items"]
        # GET on its Node worked: the slice is garbage-collected with the Node.
        assert s["metadata"]["ownerReferences"][0]["name"] == kubelet.node
        # A slice that no longer matches what the plugin publishes is replaced (PUT).
        mine = f"{slices}/{s['metadata']['name']}"
        key = f"{DRIVER}/fingerprint"
        fingerprint = s["metadata"]["annotations"][key]
        kube.patch(mine, {"metadata": {"annotations": {key: "tampered"}}})
        assert plugin.proc is not None
        plugin.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: kube.get(mine)["metadata"]["annotations"][key] == fingerprint,
            "the plugin to rewrite its slice",
            15,
        )
        request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
        kube.create(
            path_for(RES, "resourceclaims", namespace),
            {"metadata": {"name": "gpu"}, "spec": {"devices": {"requests": [request]}}},
        )
        work = kube.create(
            path_for("v1", "pods", namespace),
            {
                "metadata": {"name": "work"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": kubelet.node},
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                    "containers": [
                        {"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                },
            },
        )
        pod_path = path_for("v1", "pods", namespace, name="work")
        wait_for(
            lambda: (get_or_none(kube, pod_path) or {}).get("status", {}).get("phase") == "Running",
            "the pod to run",
            45,
        )
        rec = kubelet.container(work["metadata"]["uid"], "main")
        assert rec is not None
        env = dict(e.split("=", 1) for e in rec["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        # `dradriver doctor` in the plugin pod walks every layer with the chart's RBAC.
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = cli.main(
                [
                    "doctor",
                    f"--node={kubelet.node}",
                    f"--kubeconfig={kcfg}",
                    "--devices=fake:2xH100-80GB",
                    f"--state-dir={plugin.state_dir}",
                    f"--cdi-dir={kubelet.cdi_dir}",
                    f"--readyz=http://127.0.0.1:{plugin.port}/readyz",
                    f"--containerd-config={kubelet.root / 'none.toml'}",
                ]
            )
        assert rc == 0, out.getvalue()
        assert "ok    deviceclasses:" in out.getvalue()
        # resourceclaims/status patch worked: status.devices carries the prepared device.
        claim_path = path_for(RES, "resourceclaims", namespace, name="gpu")
        wait_for(
            lambda: kube.get(claim_path).get("status", {}).get("devices"), "status.devices", 15
        )
        kube.delete(pod_path)
        wait_for(lambda: get_or_none(kube, pod_path) is None, "the pod to be gone", 30)
        wait_for(
            lambda: not list(kubelet.cdi_dir.glob("*-claim-*.json")), "the claim unprepared", 15
        )
        assert "forbidden" not in plugin.log().lower()
    finally:
        plugin.stop()
    # The DaemonSet is there (a restart, not an uninstall): the state stays, and the GET
    # was allowed (a refusal would have logged "cannot tell").
    assert "cannot tell whether the driver is uninstalled" not in plugin.log()
    assert (plugin.state_dir / "checkpoint.json").exists()

    as_plugin = kube.with_token(token)
    try:
        refused = {
            "list secrets": lambda: as_plugin.list(path_for("v1", "secrets")),
            "list pods": lambda: as_plugin.list(path_for("v1", "pods", namespace)),
            "delete its node": lambda: as_plugin.delete(path_for("v1", "nodes", name=kubelet.node)),
            "watch secrets": lambda: next(
                as_plugin.watch(path_for("v1", "secrets"), timeout_seconds=1), None
            ),
            "create claims": lambda: as_plugin.create(
                path_for(RES, "resourceclaims", namespace), {"metadata": {"name": "x"}}
            ),
            # Node Events go to default; nowhere else.
            "create events elsewhere": lambda: as_plugin.create(
                path_for("v1", "events", namespace), node_event(kubelet.node)
            ),
            "update claim status": lambda: as_plugin.replace(
                path_for(RES, "resourceclaims", namespace, name="gpu", subresource="status"),
                kube.get(claim_path),
            ),
        }
        assert {what: status_of(fn) for what, fn in refused.items()} == dict.fromkeys(refused, 403)
        made = as_plugin.create(path_for("v1", "events", "default"), node_event(kubelet.node))
        kube.delete(path_for("v1", "events", "default", name=made["metadata"]["name"]))
    finally:
        as_plugin.close()


def node_event(node: str) -> dict[str, Any]:
    """An Event about a Node, as the plugin writes one when a GPU turns unhealthy."""
    return {
        "metadata": {"generateName": "gpu-health-"},
        "involvedObject": {"kind": "Node", "name": node},
        "reason": "GPUUnhealthy",
        "message": "e2e",
        "type": "Warning",
        "source": {"component": "dradriver"},
    }


@pytest.fixture(scope="module")
def alpha_release(helm: Path, alpha_kube: Kube) -> Iterator[Release]:
    """The chart's RBAC and policies on the control plane with every DRA feature on."""
    ns = f"dradriver-{secrets.token_hex(3)}"
    alpha_kube.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    docs = render(helm, TEST_VALUES, ns)
    try:
        for doc in docs:
            apply_object(alpha_kube, doc)
        yield Release(ns, docs)
    finally:
        uninstall(alpha_kube, docs, ns)


def test_mig_and_shares_work_with_only_the_chart_rbac(
    alpha_cluster: Cluster,
    alpha_kube: Kube,
    alpha_release: Release,
    hollow_node: Callable[..., HollowNode],
) -> None:
    """A dynamic MIG partition and a share by memory, each prepared by a plugin that acts
    as the chart's ServiceAccount with a pod-bound token: slices, prepare and the claim's
    status.devices (from 1.36 under the chart's `resourceclaims/driver` grant, the share's
    entry with its shareID) with nothing but the chart's RBAC and policies."""
    k, rel = alpha_kube, alpha_release
    ns = new_namespace(k, f"rbac-{secrets.token_hex(3)}")
    started: list[PluginProc] = []
    try:
        nodes = {}
        for role, mode, args in (
            ("mig", "dynamic", []),
            ("share", "none", ["--consumable-capacity", "memory"]),
        ):
            kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
            pod = sa_pod(k, rel.ns, f"plugin-{kubelet.node}", rel.plugin_sa, kubelet.node)
            token = request_token(k, rel.ns, rel.plugin_sa, pod)
            kcfg = token_kubeconfig(
                alpha_cluster.kubeconfig, token, kubelet.root.parent / f"{kubelet.node}.kubeconfig"
            )
            args = [*args, "--daemon-namespace", rel.ns]
            state = Path(TEST_VALUES["stateDir"]) / kubelet.node
            plugin = PluginProc(
                kcfg, kubelet, "fake:1xH100-80GB", mode, state_dir=state, extra_args=args
            )
            started.append(plugin)
            plugin.start()
            wait_for(plugin.ready, f"the {role} plugin ready as its ServiceAccount", 30)
            nodes[role] = NodeUnderTest(k, ns, kubelet, plugin)
        nodes["mig"].claim_and_pod(
            "part", 'device.attributes["gpu.dradriver.io"].profile == "1g.10gb"'
        )
        # One share is all the RBAC needs; test_consumable packs three onto a GPU.
        nodes["share"].claim_and_pod(
            "share", "true", device_class=DRIVER, request="gpu", capacity={"memory": "20Gi"}
        )
        for n, pod in [(nodes["mig"], "part"), (nodes["share"], "share")]:
            n.running(pod, timeout=120)  # as SharedGpuNode.running (test_consumable) waits
        claims = k.list(path_for(RES, "resourceclaims", ns))["items"]
        assert len(claims) == 2

        def written() -> list[dict[str, Any]] | None:
            got = [
                d
                for c in k.list(path_for(RES, "resourceclaims", ns))["items"]
                for d in (c.get("status") or {}).get("devices") or []
            ]
            return got if len(got) == len(claims) else None

        entries = wait_for(written, "every claim's status.devices", 30)
        assert {e["pool"] for e in entries} == {n.kubelet.node for n in nodes.values()}
        assert sum(1 for e in entries if e.get("shareID")) == 1
        # The share's MPS daemon: a pod the plugin made as its ServiceAccount, on its node.
        (daemon,) = k.list(
            path_for("v1", "pods", rel.ns),
            labelSelector="app.kubernetes.io/component=mps-daemon",
            fieldSelector=f"spec.nodeName={nodes['share'].kubelet.node}",
        )["items"]
        assert daemon["status"]["phase"] == "Running"
        for n in nodes.values():
            assert "forbidden" not in n.plugin.log().lower(), n.plugin.log()[-3000:]
        nodes["share"].delete("share")
        wait_for(
            lambda: (
                get_or_none(k, path_for("v1", "pods", rel.ns, name=daemon["metadata"]["name"]))
                is None
            ),
            "the daemon pod deleted by the plugin at unprepare",
            30,
        )
    finally:
        for plugin in started:
            plugin.stop()
            shutil.rmtree(plugin.state_dir, ignore_errors=True)
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def slice_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": RES,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def refusal(fn: Callable[[], object]) -> KubeError:
    with pytest.raises(KubeError) as exc:
        fn()
    return exc.value


def test_plugin_may_write_only_its_own_nodes_slices(kube: Kube, release: Release) -> None:
    tag = secrets.token_hex(3)
    node_a, node_b = f"own-a-{tag}", f"own-b-{tag}"
    slices = path_for(RES, "resourceslices")
    created: list[str] = []
    for n in (node_a, node_b):
        kube.create(path_for("v1", "nodes"), {"metadata": {"name": n}})
    as_plugin = None
    try:
        pod = sa_pod(kube, release.ns, f"plugin-{node_a}", release.plugin_sa, node_a)
        as_plugin = kube.with_token(request_token(kube, release.ns, release.plugin_sa, pod))
        theirs = slice_body(f"{node_b}-theirs", node_b)

        # RBAC and the policy both become active a moment after they are created.
        def refused_for_b() -> KubeError | None:
            assert as_plugin is not None
            try:
                as_plugin.create(slices, theirs)
            except KubeError as exc:
                return exc if POLICY_SAYS in exc.message else None
            kube.delete(f"{slices}/{theirs['metadata']['name']}", missing_ok=True)
            return None

        err = wait_for(refused_for_b, "the policy to refuse node B's slice", 30, interval=0.3)
        assert err is not None and err.status == 403
        assert f"the node its pod runs on ({node_a}), not {node_b}" in err.message

        ours = as_plugin.create(slices, slice_body(f"{node_a}-ours", node_a))
        created.append(ours["metadata"]["name"])
        stored = kube.create(slices, theirs)  # the admin may
        created.append(stored["metadata"]["name"])
        stored["spec"]["devices"].append({"name": "gpu-1"})
        err = refusal(lambda: as_plugin.replace(f"{slices}/{theirs['metadata']['name']}", stored))
        assert err.status == 403 and f"not {node_b}" in err.message
        err = refusal(lambda: as_plugin.delete(f"{slices}/{theirs['metadata']['name']}"))
        assert err.status == 403 and f"not {node_b}" in err.message
        # Moving its own slice to another node is refused too (by validation or policy).
        moved = dict(ours, spec={**ours["spec"], "nodeName": node_b})
        refusal(lambda: as_plugin.replace(f"{slices}/{ours['metadata']['name']}", moved))
        ours["spec"]["devices"].append({"name": "gpu-1"})
        as_plugin.replace(f"{slices}/{ours['metadata']['name']}", ours)
        as_plugin.delete(f"{slices}/{ours['metadata']['name']}")
        with pytest.raises(NotFound):
            kube.get(f"{slices}/{ours['metadata']['name']}")

        # On its own node, as another driver, or into a pool not named after its node:
        # refused (it could otherwise publish devices as a driver it is not).
        for name, spec in (
            ("driver", {"driver": "other.example.io"}),
            ("pool", {"pool": {"name": node_b, "generation": 1, "resourceSliceCount": 1}}),
        ):
            body = slice_body(f"{node_a}-{name}", node_a)
            body["spec"].update(spec)
            err = refusal(lambda body=body: as_plugin.create(slices, body))
            assert err.status == 403, err
            assert f"ResourceSlices of driver {DRIVER} in the pool named after its node" in (
                err.message
            )
        # Nor may it take over, or withdraw, another driver's slice on its own node.
        other = slice_body(f"{node_a}-other", node_a)
        other["spec"]["driver"] = "other.example.io"
        other = kube.create(slices, other)
        created.append(other["metadata"]["name"])
        err = refusal(lambda: as_plugin.delete(f"{slices}/{other['metadata']['name']}"))
        assert err.status == 403 and "ResourceSlices of driver" in err.message
        taken = dict(other, spec={**other["spec"], "driver": DRIVER})
        refusal(lambda: as_plugin.replace(f"{slices}/{other['metadata']['name']}", taken))

        # A token of the plugin's ServiceAccount that no pod holds names no node: nothing.
        unbound = kube.with_token(request_token(kube, release.ns, release.plugin_sa, None))
        try:
            err = refusal(lambda: unbound.create(slices, slice_body(f"{node_a}-x", node_a)))
            assert err.status == 403 and "its token names no node" in err.message
        finally:
            unbound.close()
    finally:
        if as_plugin is not None:
            as_plugin.close()
        for name in created:
            kube.delete(f"{slices}/{name}", missing_ok=True)
        for n in (node_a, node_b):
            kube.delete(path_for("v1", "nodes", name=n), missing_ok=True)


DAEMON_POLICY_SAYS = "may create and delete daemon pods only on the node its pod runs on"


def daemon_pod(release: Release, node: str, name: str, **change: Any) -> dict[str, Any]:
    """The pod the plugin makes for an MPS daemon on `node` (daemons/spec.py), with the
    chart's image and a directory under the chart's state directory; `change` replaces
    parts of its spec."""
    from dradriver.kubeletplugin.daemons.spec import CLAIM, DaemonSpec, PodSite, pod_manifest
    from dradriver.nvml.host import DaemonCommand

    state = TEST_VALUES["stateDir"]
    spec = DaemonSpec(
        name=name,
        role="mps",
        serves=((CLAIM, "c-uid"),),
        command=DaemonCommand((sys.executable, "-m", "fakenvml.mpsd")),
        dirs=(f"{state}/mps/{name}/pipe",),
    )
    pod = pod_manifest(spec, PodSite(node, release.ns, HOST_IMAGE))
    pod["spec"].update(change)
    return pod


def test_plugin_may_run_only_its_own_nodes_daemon_pods(kube: Kube, release: Release) -> None:
    """RBAC grants pods create and delete in the plugin's namespace; the daemon-pod policy
    keeps them to its own node's MPS and IMEX daemons of the chart's image and shape."""
    tag = secrets.token_hex(3)
    node_a, node_b = f"dmn-a-{tag}", f"dmn-b-{tag}"
    pods = path_for("v1", "pods", release.ns)
    for n in (node_a, node_b):
        kube.create(path_for("v1", "nodes"), {"metadata": {"name": n}})
    as_plugin = None
    try:
        holder = sa_pod(kube, release.ns, f"plugin-{node_a}", release.plugin_sa, node_a)
        as_plugin = kube.with_token(request_token(kube, release.ns, release.plugin_sa, holder))

        def refused_on_b() -> KubeError | None:
            assert as_plugin is not None
            try:
                as_plugin.create(pods, daemon_pod(release, node_b, f"mps-b-{tag}"))
            except KubeError as exc:
                return exc if DAEMON_POLICY_SAYS in exc.message else None
            kube.delete(f"{pods}/mps-b-{tag}", grace_period=0, missing_ok=True)
            return None

        err = wait_for(refused_on_b, "the policy to refuse node B's daemon", 30, interval=0.3)
        assert err is not None and err.status == 403 and f"({node_a})" in err.message
        # Its own node's daemon, as the plugin makes it: created, and deleted by it.
        ours = as_plugin.create(pods, daemon_pod(release, node_a, f"mps-a-{tag}"))
        shape = "a daemon pod of the dradriver kubelet plugin runs one container of"
        for what, change in (
            ("another image", {"containers": [{"name": "c", "image": PAUSE}]}),
            (
                "a host path elsewhere",
                {"volumes": [{"name": "dir-0", "hostPath": {"path": "/etc"}}]},
            ),
            ("the host network for MPS", {"hostNetwork": True}),
            ("the host's PIDs", {"hostPID": True}),
            ("an API token", {"automountServiceAccountToken": True}),
            (
                "a privileged container where no group runs on real GPUs",
                {
                    "containers": [
                        {"name": "c", "image": HOST_IMAGE, "securityContext": {"privileged": True}}
                    ]
                },
            ),
        ):
            body = daemon_pod(release, node_a, f"mps-x-{tag}", **change)
            err = refusal(lambda body=body: as_plugin.create(pods, body))
            assert err.status == 403 and shape in err.message, (what, err.message)
        plain = daemon_pod(release, node_a, f"plain-{tag}")
        plain["metadata"]["labels"] = {}
        err = refusal(lambda: as_plugin.create(pods, plain))
        assert err.status == 403 and "only its MPS and IMEX daemon pods" in err.message
        # Another node's daemon, and a pod of its namespace that is no daemon: not its to delete.
        theirs = kube.create(pods, daemon_pod(release, node_b, f"mps-b-{tag}"))
        err = refusal(lambda: as_plugin.delete(f"{pods}/{theirs['metadata']['name']}"))
        assert err.status == 403 and f"({node_a})" in err.message
        err = refusal(lambda: as_plugin.delete(f"{pods}/{holder['metadata']['name']}"))
        assert err.status == 403
        assert status_of(lambda: as_plugin.patch(f"{pods}/{ours['metadata']['name']}", {})) == 403
        as_plugin.delete(f"{pods}/{ours['metadata']['name']}")
    finally:
        if as_plugin is not None:
            as_plugin.close()
        for name in (f"mps-a-{tag}", f"mps-b-{tag}"):
            kube.delete(f"{pods}/{name}", grace_period=0, missing_ok=True)
        for n in (node_a, node_b):
            kube.delete(path_for("v1", "nodes", name=n), missing_ok=True)


def test_plugin_may_set_only_its_own_nodes_clique_label(kube: Kube, release: Release) -> None:
    tag = secrets.token_hex(3)
    node_a, node_b = f"lbl-a-{tag}", f"lbl-b-{tag}"
    key = "gpu.dradriver.io/nvlink-domain"
    clique = "00000000-0000-4000-8000-00000000c0de.1"
    for n in (node_a, node_b):
        kube.create(path_for("v1", "nodes"), {"metadata": {"name": n, "labels": {"team": "x"}}})
    as_plugin = None
    try:
        pod = sa_pod(kube, release.ns, f"plugin-{node_a}", release.plugin_sa, node_a)
        as_plugin = kube.with_token(request_token(kube, release.ns, release.plugin_sa, pod))

        def label(node: str, labels: dict[str, Any]) -> Any:
            assert as_plugin is not None
            return as_plugin.patch(
                path_for("v1", "nodes", name=node), {"metadata": {"labels": labels}}
            )

        def refused_for_b() -> KubeError | None:
            try:
                label(node_b, {key: clique})
            except KubeError as exc:
                return exc if "may label only the node its pod runs on" in exc.message else None
            return None

        err = wait_for(refused_for_b, "the policy to refuse node B's label", 30, interval=0.3)
        assert err is not None and err.status == 403
        assert f"({node_a}), not {node_b}" in err.message
        assert label(node_a, {key: clique})["metadata"]["labels"][key] == clique
        err = refusal(lambda: label(node_a, {"team": "mine"}))
        assert err.status == 403 and "only the gpu.dradriver.io/nvlink-domain label" in err.message
        err = refusal(
            lambda: as_plugin.patch(
                path_for("v1", "nodes", name=node_a), {"spec": {"unschedulable": True}}
            )
        )
        assert err.status == 403
        # An owner would have the garbage collector delete the Node with it; a finalizer
        # nobody removes would keep a deleted Node forever. Neither is the label.
        owner = {"apiVersion": "v1", "kind": "Node", "name": node_b, "uid": secrets.token_hex(8)}
        for meta in ({"ownerReferences": [owner]}, {"finalizers": ["example.io/keep"]}):
            err = refusal(
                lambda meta=meta: as_plugin.patch(
                    path_for("v1", "nodes", name=node_a),
                    {"metadata": {**meta, "labels": {key: clique}}},
                )
            )
            assert err.status == 403, meta
            assert "only the gpu.dradriver.io/nvlink-domain label" in err.message
        assert key not in label(node_a, {key: None})["metadata"]["labels"]
    finally:
        if as_plugin is not None:
            as_plugin.close()
        for n in (node_a, node_b):
            kube.delete(path_for("v1", "nodes", name=n), missing_ok=True)


def test_controller_works_with_only_the_chart_rbac(
    cluster: Cluster, kube: Kube, release: Release, tmp_path: Path
) -> None:
    pod = sa_pod(kube, release.ns, "controller", release.controller_sa)
    token = request_token(kube, release.ns, release.controller_sa, pod)
    kcfg = token_kubeconfig(cluster.kubeconfig, token, tmp_path / "controller.kubeconfig")
    dep = one(release.docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = [a for a in dep["command"][2:] if not a.startswith(("--webhook-port", "--healthz-port"))]
    healthz = free_port()
    log_path = tmp_path / "controller.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dradriver.cli",
                "controller",
                *args,
                f"--namespace={release.ns}",
                f"--kubeconfig={kcfg}",
                "--webhook-address=127.0.0.1",
                "--webhook-port=0",
                f"--healthz-port={healthz}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:

        def ready() -> bool:
            import urllib.error
            import urllib.request

            assert proc.poll() is None, f"controller exited:\n{log_path.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/readyz", timeout=2) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for(ready, "the controller's /readyz", 30, interval=0.3)
        vwc = kube.get(
            path_for(
                "admissionregistration.k8s.io/v1",
                "validatingwebhookconfigurations",
                name=release.named("ValidatingWebhookConfiguration"),
            )
        )
        assert vwc["webhooks"][0]["clientConfig"].get("caBundle")
        assert vwc["webhooks"][0]["failurePolicy"] == "Ignore"
        compute_domain_with_chart_rbac(kube, release.ns)
        # The fleet's metrics, from what the chart's RBAC lets it watch.
        import urllib.request

        def fleet_updated() -> bool:
            url = f"http://127.0.0.1:{healthz}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            return any(
                line.startswith("dradriver_fleet_updates_total ") and float(line.split()[1]) >= 1
                for line in text.splitlines()
            )

        wait_for(fleet_updated, "the fleet's metrics", 30, interval=0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/fleet", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/html")
            assert '<table id="fleet">' in r.read().decode()
        assert "forbidden" not in log_path.read_text().lower()
        as_controller = kube.with_token(token)
        try:
            only_domain_templates(kube, as_controller, release.ns)
        finally:
            as_controller.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def compute_domain_with_chart_rbac(kube: Kube, ns: str) -> None:
    """The controller, as its ServiceAccount, places a domain on a node whose slice names a
    fabric clique (both made here by the admin), makes its template, writes its status,
    and on deletion deletes the template and lets the domain go."""
    from dradriver.api import computedomain as cd

    node = f"cd-rbac-{secrets.token_hex(3)}"
    clique = "00000000-0000-4000-8000-00000000c0de.1"
    kube.create(path_for("v1", "nodes"), {"metadata": {"name": node}})
    body = slice_body(node, node)
    body["spec"]["devices"] = [
        {
            "name": "channel-0",
            "attributes": {
                "type": {"string": "imex-channel"},
                "channel": {"int": 0},
                "nvlinkDomain": {"string": clique},
            },
        }
    ]
    kube.create(path_for(RES, "resourceslices"), body)
    cds = path_for(cd.API_VERSION, cd.PLURAL, ns)
    try:
        kube.create(
            cds,
            {
                "apiVersion": cd.API_VERSION,
                "kind": cd.KIND,
                "metadata": {"name": "rbac"},
                "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "rbac-ch"}}},
            },
        )

        def placed() -> bool:
            st = kube.get(f"{cds}/rbac").get("status") or {}
            return st.get("clique") == clique

        wait_for(placed, "the domain placed by the controller", 30, interval=0.3)
        template = path_for(RES, "resourceclaimtemplates", ns, name="rbac-ch")
        assert kube.get(template)["metadata"]["annotations"][cd.CLIQUE_ANNOTATION] == clique
        kube.delete(f"{cds}/rbac")
        wait_for(lambda: get_or_none(kube, f"{cds}/rbac") is None, "the domain gone", 30)
        assert get_or_none(kube, template) is None
    finally:
        kube.delete(path_for(RES, "resourceslices", name=node), missing_ok=True)
        kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)


def only_domain_templates(kube: Kube, as_controller: Kube, ns: str) -> None:
    """RBAC lets the controller create and delete templates in every namespace; the
    chart's policy keeps it to its ComputeDomains' (owned by one, labelled with its UID)."""
    from dradriver.api import computedomain as cd

    says = "may only write and delete the ResourceClaimTemplates of its ComputeDomains"
    path = path_for(RES, "resourceclaimtemplates", ns)
    spec = {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}
    }
    users = kube.create(path, {"metadata": {"name": "users"}, "spec": spec})
    # A real domain to own the templates: one whose owner does not exist is deleted by the
    # garbage collector, maybe before the controller's own delete is tried (CI 2026-12-06).
    cds = path_for(cd.API_VERSION, cd.PLURAL, ns)
    domain = kube.create(
        cds,
        {
            "apiVersion": cd.API_VERSION,
            "kind": cd.KIND,
            "metadata": {"name": "owner"},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "owner-ch"}}},
        },
    )
    uid = domain["metadata"]["uid"]
    owner = {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "name": "owner",
        "uid": uid,
        "controller": True,
    }
    for name, meta in (
        ("planted", {}),
        ("unlabelled", {"ownerReferences": [owner]}),
        ("mislabelled", {"ownerReferences": [owner], "labels": {cd.DOMAIN_LABEL: "x"}}),
    ):
        err = refusal(
            lambda name=name, meta=meta: as_controller.create(
                path, {"metadata": {"name": name, **meta}, "spec": spec}
            )
        )
        assert err.status == 403 and says in err.message, (name, err)
    err = refusal(lambda: as_controller.delete(f"{path}/users"))
    assert err.status == 403 and says in err.message, err
    assert kube.get(f"{path}/users")["metadata"]["uid"] == users["metadata"]["uid"]
    # A domain's template it may make and delete.
    meta = {"name": "domains", "ownerReferences": [owner], "labels": {cd.DOMAIN_LABEL: uid}}
    as_controller.create(path, {"metadata": meta, "spec": spec})
    as_controller.delete(f"{path}/domains")
    kube.delete(f"{path}/users")
    kube.delete(f"{cds}/owner")
    wait_for(lambda: get_or_none(kube, f"{cds}/owner") is None, "the owning domain gone", 30)


CLAIM_POLICY_SAYS = "the dradriver kubelet plugin may"
OTHER = "other.example.io"


def _allocate(kube: Kube, ns: str, name: str, node: str) -> dict[str, Any]:
    """A claim allocated to `node`, as the scheduler would write it (the admin may)."""
    path = path_for(RES, "resourceclaims", ns)
    kube.create(
        path,
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.io"}}
                    ]
                }
            },
        },
    )
    claim = kube.get(f"{path}/{name}")
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
                    # Another driver's device in the same claim: its entries are not ours.
                    {"request": "gpu", "driver": OTHER, "pool": node, "device": "gpu-0"},
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": f"p-{name}", "uid": f"uid-{name}"}],
    }
    return kube.replace(f"{path}/{name}/status", claim)


def _entry(driver: str, pool: str) -> dict[str, Any]:
    return {"driver": driver, "pool": pool, "device": "gpu-0", "conditions": []}


# From 1.36 the API server itself checks who writes a claim's status
# (DRAResourceClaimGranularStatusAuthorization) before the chart's policy sees the write:
# status.devices against `resourceclaims/driver`, the allocation and reservedFor against
# `resourceclaims/binding`. Its refusal is a 422 naming the subresource.
DRIVER_AUTHZ_SAYS = 'requires resource="resourceclaims/driver"'
BINDING_AUTHZ_SAYS = 'requires resource="resourceclaims/binding"'


def refused_as(err: KubeError, cluster: Cluster, policy_says: str, authz_says: str) -> None:
    """Refused by the API server's own authorization where the line has it, else by the
    chart's policy."""
    if cluster.line.claim_status_per_driver:
        assert err.status == 422 and authz_says in err.message, err
    else:
        assert err.status == 403 and CLAIM_POLICY_SAYS in err.message, err
        assert policy_says in err.message, err


def test_plugin_may_write_only_its_own_claims_device_status(
    cluster: Cluster, kube: Kube, release: Release
) -> None:
    """With a real pod-bound token of the plugin's ServiceAccount on node A: its own
    driver's status.devices entries on a claim allocated to A go through (from 1.36 under
    the chart's `resourceclaims/driver` grant); another node's claim, the allocation,
    reservedFor and another driver's entries are refused."""
    tag = secrets.token_hex(3)
    node_a, node_b = f"cs-a-{tag}", f"cs-b-{tag}"
    ns = release.ns
    for n in (node_a, node_b):
        kube.create(path_for("v1", "nodes"), {"metadata": {"name": n}})
    as_plugin = None
    claims = path_for(RES, "resourceclaims", ns)
    try:
        ours = _allocate(kube, ns, f"ours-{tag}", node_a)
        theirs = _allocate(kube, ns, f"theirs-{tag}", node_b)
        pod = sa_pod(kube, ns, f"plugin-{node_a}", release.plugin_sa, node_a)
        as_plugin = kube.with_token(request_token(kube, ns, release.plugin_sa, pod))

        def status_write(claim: dict[str, Any], devices: list[dict[str, Any]], **status: Any):
            assert as_plugin is not None
            body = {
                "apiVersion": RES,
                "kind": "ResourceClaim",
                "metadata": {"name": claim["metadata"]["name"], "namespace": ns},
                "status": {"devices": devices, **status},
            }
            return lambda: as_plugin.apply(
                f"{claims}/{claim['metadata']['name']}/status", body, field_manager=DRIVER
            )

        def refused_for_b() -> KubeError | None:
            try:
                status_write(theirs, [_entry(DRIVER, node_b)])()
            except KubeError as exc:
                said = (CLAIM_POLICY_SAYS, DRIVER_AUTHZ_SAYS)
                return exc if any(x in exc.message for x in said) else None
            return None

        err = wait_for(refused_for_b, "the policy to refuse node B's claim", 30, interval=0.3)
        assert err is not None
        refused_as(
            err,
            cluster,
            f"claims allocated to the node its pod runs on ({node_a})",
            DRIVER_AUTHZ_SAYS,
        )
        # Rewriting node B's reservedFor (the probe cleared it): refused.
        intruder = [{"resource": "pods", "name": "intruder", "uid": f"intruder-{tag}"}]
        err = refusal(status_write(theirs, [], reservedFor=intruder))
        refused_as(err, cluster, CLAIM_POLICY_SAYS, BINDING_AUTHZ_SAYS)
        # Its own claim: its own driver's entry goes through...
        status_write(ours, [_entry(DRIVER, node_a)])()
        stored = kube.get(f"{claims}/{ours['metadata']['name']}")
        assert [d["driver"] for d in stored["status"]["devices"]] == [DRIVER]
        # ... but not an entry for another node's pool, another driver's entry, or a
        # change to the allocation or reservedFor.
        # (An entry for a device the claim was not allocated is refused by the API
        # server's own validation already; the policy refuses another pool besides.)
        err = refusal(status_write(ours, [_entry(DRIVER, node_b)]))
        assert err.status in (403, 422)
        err = refusal(status_write(ours, [_entry(DRIVER, node_a), _entry(OTHER, node_a)]))
        refused_as(err, cluster, "entries of its own driver", DRIVER_AUTHZ_SAYS)
        err = refusal(status_write(ours, [_entry(DRIVER, node_a)], reservedFor=intruder))
        refused_as(err, cluster, "allocation or reservedFor", BINDING_AUTHZ_SAYS)
        # Removing its own entries (unprepare) goes through.
        status_write(ours, [])()
        assert not kube.get(f"{claims}/{ours['metadata']['name']}")["status"].get("devices")
    finally:
        if as_plugin is not None:
            as_plugin.close()
        for name in (f"ours-{tag}", f"theirs-{tag}"):
            kube.delete(f"{claims}/{name}", missing_ok=True)
        for n in (node_a, node_b):
            kube.delete(path_for("v1", "nodes", name=n), missing_ok=True)


def test_controller_may_patch_only_its_webhooks_cabundle(kube: Kube, release: Release) -> None:
    """With a real pod-bound token of the controller's ServiceAccount: the caBundle goes
    through; pointing the webhook elsewhere, widening its rules or weakening its failure
    policy is refused, though RBAC alone would allow each."""
    pod = sa_pod(kube, release.ns, "controller-probe", release.controller_sa)
    as_ctrl = kube.with_token(request_token(kube, release.ns, release.controller_sa, pod))
    path = path_for(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        name=release.named("ValidatingWebhookConfiguration"),
    )
    try:
        policy = next(
            d["metadata"]["name"]
            for d in release.docs
            if d["kind"] == "ValidatingAdmissionPolicy"
            and d["metadata"]["name"].endswith("-webhook-cabundle-only")
        )
        bad = [{"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "x"}]

        def refused() -> KubeError | None:
            try:
                as_ctrl.patch(path, bad, "json")
            except KubeError as exc:
                return exc if "dradriver controller may" in exc.message else None
            return None

        err = wait_for(refused, f"policy {policy} to refuse a new Service", 30, interval=0.3)
        assert err is not None and err.status == 403
        attempts = {
            "url": [
                {"op": "remove", "path": "/webhooks/0/clientConfig/service"},
                {
                    "op": "add",
                    "path": "/webhooks/0/clientConfig/url",
                    "value": "https://evil.example",
                },
            ],
            "rules": [
                {
                    "op": "add",
                    "path": "/webhooks/0/rules/-",
                    "value": {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["secrets"],
                    },
                }
            ],
            "failurePolicy": [
                {
                    "op": "replace",
                    "path": "/webhooks/0/failurePolicy",
                    "value": "Fail"
                    if kube.get(path)["webhooks"][0]["failurePolicy"] == "Ignore"
                    else "Ignore",
                }
            ],
        }
        for what, ops in attempts.items():
            with pytest.raises(KubeError) as info:
                as_ctrl.patch(path, ops, "json")
            assert info.value.status == 403, (what, info.value.message)
        before = kube.get(path)["webhooks"][0]["clientConfig"].get("caBundle")
        ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
        as_ctrl.patch(
            path,
            [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca.decode()}],
            "json",
        )
        assert kube.get(path)["webhooks"][0]["clientConfig"]["caBundle"] == ca.decode()
        restore = (
            {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": before}
            if before
            else {"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}
        )
        kube.patch(path, [restore], "json")
    finally:
        as_ctrl.close()
        kube.delete(path_for("v1", "pods", release.ns, name="controller-probe"), missing_ok=True)


def test_privilege_follows_the_devices(helm: Path) -> None:
    """Privileged only where NVML and MIG need it; with fake devices nothing is, and no
    host directory but the plugin's own (kubelet sockets, CDI, state) is mounted."""
    real = one(render(helm), "DaemonSet")["spec"]["template"]["spec"]
    (c,) = real["containers"]
    assert c["securityContext"]["privileged"] is True
    (root,) = [v for v in real["volumes"] if v["name"] == "driver-root"]
    assert root["hostPath"]["path"] == "/usr"  # never the host's /
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "driver-root"]
    assert mount["readOnly"] is True
    containerized = one(render(helm, {"driverRoot": "/run/nvidia/driver/"}), "DaemonSet")
    (root,) = [
        v
        for v in containerized["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "driver-root"
    ]
    assert root["hostPath"]["path"] == "/run/nvidia/driver/usr"
    legacy = {"devices": "fake:2xH100-80GB", "driverFiles": "runtime"}
    fake = one(render(helm, legacy), "DaemonSet")["spec"]["template"]
    (c,) = fake["spec"]["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # The registration directory and the driver's own under plugins/, never plugins/ with
    # every other CSI and DRA driver's socket.
    assert {v["hostPath"]["path"] for v in fake["spec"]["volumes"] if "hostPath" in v} == {
        "/var/lib/kubelet/plugins_registry",
        f"/var/lib/kubelet/plugins/{DRIVER}",
        "/var/run/cdi",
        "/var/lib/dradriver",
    }
    nvidia = one(render(helm, {**legacy, "nvidiaCompatible": True}), "DaemonSet")
    assert "/var/lib/kubelet/plugins/gpu.nvidia.com" in {
        v["hostPath"]["path"]
        for v in nvidia["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    # Everything it writes is in its volumes: the image cannot be changed under it.
    for container in (c, real["containers"][0]):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (tmp,) = [v for v in fake["spec"]["volumes"] if v["name"] == "tmp"]
    assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}


def test_driver_files_follow_their_values(helm: Path) -> None:
    """driverFiles cdi (the default): the plugin reads the driver root's usr/ and GSP
    firmware, read-only, to list the driver's files, and names the root as the host sees
    it; runtime: neither, with fake devices not even the driver root."""

    def plugin(values: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], set[str]]:
        spec = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: paths[m["name"]] for m in c["volumeMounts"] if m["name"] in paths}
        ro = {m["mountPath"] for m in c["volumeMounts"] if m.get("readOnly")}
        return {e["name"]: e.get("value", "") for e in c["env"]}, mounts, ro

    fake = {"devices": "fake:2xH100-80GB", "driverRoot": "/run/nvidia/driver"}
    env, mounts, ro = plugin(fake)
    assert env["DRADRIVER_DRIVER_FILES"] == "cdi"
    assert (env["DRADRIVER_DRIVER_ROOT"], env["DRADRIVER_HOST_DRIVER_ROOT"]) == (
        "/driver-root",
        "/run/nvidia/driver",
    )
    assert env["DRADRIVER_CDI_HOOK_PATH"] == ""  # the image's hook, installed by the plugin
    assert mounts["/driver-root/usr"] == "/run/nvidia/driver/usr"
    assert mounts["/driver-root/lib/firmware/nvidia"] == "/run/nvidia/driver/lib/firmware/nvidia"
    assert {"/driver-root/usr", "/driver-root/lib/firmware/nvidia"} <= ro
    hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert plugin({"cdiHookPath": hook})[0]["DRADRIVER_CDI_HOOK_PATH"] == hook
    env, mounts, _ = plugin({**fake, "driverFiles": "runtime"})
    assert env["DRADRIVER_DRIVER_FILES"] == "runtime" and "DRADRIVER_DRIVER_ROOT" not in env
    assert not any(m.startswith("/driver-root") for m in mounts)
    env, mounts, _ = plugin({"driverFiles": "runtime"})  # NVML still needs the root's usr/
    assert "/driver-root/usr" in mounts and "/driver-root/lib/firmware/nvidia" not in mounts
    with pytest.raises(HelmError):
        render(helm, {"driverFiles": "both"})


def test_the_hosts_cgroups_are_mounted_only_where_shares_limit_pods(helm: Path) -> None:
    """With consumable capacity on real GPUs the plugin sets each share's memory as its
    pods' cgroup GPU-memory limit: the host's cgroup v2 tree at the host's path; never
    with fake devices or with consumable capacity off."""

    def mounts(values: dict[str, Any]) -> dict[str, str]:
        spec = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        return {m["mountPath"]: paths[m["name"]] for m in c["volumeMounts"] if m["name"] in paths}

    on = {"kubeletPlugin": {"consumableCapacity": "memory"}}
    assert mounts(on)["/sys/fs/cgroup"] == "/sys/fs/cgroup"
    assert "/sys/fs/cgroup" not in mounts({})
    assert "/sys/fs/cgroup" not in mounts({**on, "devices": "fake:2xH100-80GB"})


def test_claim_status_follows_its_value(helm: Path) -> None:
    """kubeletPlugin.claimStatus turns the plugin's only claim write on or off."""

    def env(values: dict[str, Any]) -> dict[str, str]:
        (c,) = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in c["env"]}

    assert env({})["DRADRIVER_CLAIM_STATUS"] == "on"
    assert env({"kubeletPlugin": {"claimStatus": False}})["DRADRIVER_CLAIM_STATUS"] == "off"


def test_health_follows_its_values(helm: Path) -> None:
    def env(values: dict[str, Any]) -> dict[str, str]:
        (c,) = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in c["env"]}

    default = env({})
    assert default["DRADRIVER_HEALTH_TAINT_EFFECT"] == "NoSchedule"
    assert default["DRADRIVER_HEALTH_SKIP_XIDS"] == "13,31,43,45,68,109"
    assert (
        default["DRADRIVER_HEALTH_PROBE_PERIOD"],
        default["DRADRIVER_HEALTH_RECOVERY_PROBES"],
    ) == (
        "5",
        "3",
    )
    chosen = env({"kubeletPlugin": {"health": {"taintEffect": "NoExecute", "skipXids": [13]}}})
    assert chosen["DRADRIVER_HEALTH_TAINT_EFFECT"] == "NoExecute"
    assert chosen["DRADRIVER_HEALTH_SKIP_XIDS"] == "13"


def test_mig_profiles_follow_their_value(helm: Path) -> None:
    def env(values: dict[str, Any]) -> dict[str, str]:
        (c,) = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value", "") for e in c["env"]}

    assert env({})["DRADRIVER_MIG_PROFILES"] == ""
    chosen = env({"migProfiles": ["1g.10gb", "3g.40gb"]})
    assert chosen["DRADRIVER_MIG_PROFILES"] == "1g.10gb,3g.40gb"


def test_node_groups_give_each_group_its_own_daemonset(helm: Path) -> None:
    """deploy/kind/values.yaml's four groups: a DaemonSet each, on the nodes the group's
    selector picks, with the group's devices and modes over the top-level values."""
    values = yaml.safe_load((REPO / "deploy" / "kind" / "values.yaml").read_text())
    values["kubeletPlugin"] = {"nodeSelector": {"gpu": "yes"}}
    daemonsets = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in render(helm, values, kube_version=KIND_KUBE_VERSION)
        if d["kind"] == "DaemonSet"
    }
    assert sorted(daemonsets) == [
        "dradriver-kubelet-plugin-gb200",
        "dradriver-kubelet-plugin-h100",
        "dradriver-kubelet-plugin-mixed",
        "dradriver-kubelet-plugin-shared",
    ]

    def env(spec: dict[str, Any]) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in spec["containers"][0]["env"]}

    h100 = daemonsets["dradriver-kubelet-plugin-h100"]
    assert h100["nodeSelector"] == {"dradriver.io/fake-gpus": "h100", "gpu": "yes"}
    assert env(h100)["DRADRIVER_DEVICES"] == "fake:8xH100-80GB"
    assert env(h100)["DRADRIVER_MIG_MODE"] == "dynamic"
    assert env(h100)["DRADRIVER_CONSUMABLE_CAPACITY"] == "off"
    shared = env(daemonsets["dradriver-kubelet-plugin-shared"])
    assert (shared["DRADRIVER_MIG_MODE"], shared["DRADRIVER_CONSUMABLE_CAPACITY"]) == (
        "none",
        "memory",
    )
    # The trays: IMEX channels, so in the host's network; the others not.
    trays = daemonsets["dradriver-kubelet-plugin-gb200"]
    assert env(trays)["DRADRIVER_IMEX_CHANNELS"] == "on" and trays.get("hostNetwork") is True
    assert env(trays)["DRADRIVER_DEVICES"].startswith("fake:driver=570.158.01;4xGB200")
    assert not h100.get("hostNetwork")
    # Without groups the one DaemonSet keeps its name and selector (an upgrade to this
    # chart must not need the DaemonSet recreated: a selector is immutable).
    (ds,) = [d for d in render(helm) if d["kind"] == "DaemonSet"]
    assert ds["metadata"]["name"] == "dradriver-kubelet-plugin"
    assert "dradriver.io/node-group" not in ds["spec"]["selector"]["matchLabels"]


def test_node_groups_refuse_what_would_collide(helm: Path) -> None:
    gates = {"featureGates": {"DRAPartitionableDevices": True}}
    group = {"name": "a", "nodeSelector": {"x": "1"}}
    with pytest.raises(HelmError, match="nodeSelector"):
        render(helm, {"nodeGroups": [{"name": "a", "nodeSelector": {}}]})
    with pytest.raises(HelmError, match="used twice"):
        render(helm, {"nodeGroups": [group, group]})
    with pytest.raises(HelmError, match=r"DRAPartitionableDevices"):
        render(helm, {"nodeGroups": [{**group, "migMode": "dynamic"}]})
    with pytest.raises(HelmError, match="cannot be combined with migMode dynamic"):
        render(
            helm,
            {
                **gates,
                "nodeGroups": [{**group, "migMode": "dynamic", "consumableCapacity": "memory"}],
            },
        )
    with pytest.raises(HelmError, match="nodeGroups"):
        render(helm, {"nodeGroups": [{**group, "devices": "gpus"}]})


def test_schema_checks_the_plugin_values_where_they_are(helm: Path) -> None:
    """values.schema.json checked consumableCapacity and health under `controller`, where
    no such values exist, so a typo in the plugin's own values rendered unchecked."""
    with pytest.raises(HelmError, match="consumableCapacity"):
        render(helm, {"kubeletPlugin": {"consumableCapacity": "half"}})
    with pytest.raises(HelmError, match="taintEffect"):
        render(helm, {"kubeletPlugin": {"health": {"taintEffect": "Evict"}}})
    with pytest.raises(HelmError, match="nodeGroups"):
        render(helm, {"nodeGroups": [{"name": "a", "nodeSelector": {"x": "1"}, "mig": "on"}]})


def test_imex_channels_follow_their_value(helm: Path) -> None:
    """computeDomains.imexChannels turns the plugin's IMEX channels on; off without
    ComputeDomains at all (no controller would place a domain on them)."""

    def env(values: dict[str, Any], name: str = "DRADRIVER_IMEX_CHANNELS") -> str:
        (c,) = one(render(helm, values), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return str({e["name"]: e.get("value", "") for e in c["env"]}[name])

    def watches_claims(values: dict[str, Any]) -> bool:
        role = next(
            d
            for d in render(helm, values)
            if d["kind"] == "ClusterRole" and "kubelet-plugin" in d["metadata"]["name"]
        )
        return any(
            "resourceclaims" in r["resources"] and "watch" in r["verbs"] for r in role["rules"]
        )

    assert env({}) == "off"
    assert env({"computeDomains": {"imexChannels": True}}) == "on"
    assert env({"computeDomains": {"imexChannels": True, "enabled": False}}) == "off"
    # Binding conditions: auto by default; the binder's claim watch only with channels.
    assert env({}, "DRADRIVER_IMEX_BINDING_CONDITIONS") == "auto"
    off = {"computeDomains": {"bindingConditions": "off"}}
    assert env(off, "DRADRIVER_IMEX_BINDING_CONDITIONS") == "off"
    assert watches_claims({"computeDomains": {"imexChannels": True}})
    assert not watches_claims({})
    with pytest.raises(HelmError, match="bindingConditions"):
        render(helm, {"computeDomains": {"bindingConditions": "yes"}})

    # The daemon binds the node's address: the plugin in the host's network, replaced
    # in place on upgrade (two instances cannot share the host's /healthz port).
    def spec(values: dict[str, Any], group: str = "") -> dict[str, Any]:
        docs = [d for d in render(helm, values) if d["kind"] == "DaemonSet"]
        (ds,) = [d for d in docs if d["metadata"]["name"].endswith(group)]
        return dict(ds["spec"])

    on = spec({"computeDomains": {"imexChannels": True}})
    assert on["template"]["spec"]["hostNetwork"] is True
    assert on["template"]["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert on["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    plain = spec({})
    assert "hostNetwork" not in plain["template"]["spec"]
    assert plain["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # Per node group: only the GB200 trays'.
    groups = {
        "nodeGroups": [
            {"name": "gb200", "nodeSelector": {"rack": "a"}, "imexChannels": True},
            {"name": "h100", "nodeSelector": {"rack": "b"}},
        ]
    }
    assert spec(groups, "gb200")["template"]["spec"]["hostNetwork"] is True
    assert "hostNetwork" not in spec(groups, "h100")["template"]["spec"]
    assert watches_claims(groups)
    with_off = {"computeDomains": {"imexChannels": True}, **groups}
    with_off["nodeGroups"][1]["imexChannels"] = False  # type: ignore[index]
    assert "hostNetwork" not in spec(with_off, "h100")["template"]["spec"]


def test_the_driver_root_gives_the_plugin_the_drivers_commands(helm: Path) -> None:
    """nvidia-smi (time-slicing), nvidia-cuda-mps-control (MPS) and nvidia-imex are the
    host driver's: with nvml the plugin finds them on PATH, from the driver root."""
    (c,) = one(render(helm, {}), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    script = c["command"][-1]
    assert 'export PATH="$PATH:/driver-root/usr/bin"' in script
    assert "libcuda.so.1" in script and script.rstrip().endswith("exec dradriver kubelet-plugin")


def test_quota_classes_select_exactly_their_product_or_profile(helm: Path) -> None:
    """`dradriver fleet --quota-classes` values for a mixed fleet (H100s and A100s in
    dynamic MIG mode, L4s), rendered by the chart: each class's CEL selects exactly the
    devices it is named for, evaluated as the scheduler does (diagnose/cel.py)."""
    from dradriver.diagnose.cel import Selector
    from dradriver.diagnose.fleet_quota import quota_class_names, quota_classes
    from dradriver.diagnose.world import build_world
    from dradriver.inventory.node_devices import MigMode
    from dradriver.nvml.library import open_nvml
    from dradriver.slices.build import build
    from dradriver.slices.publish import render as render_slices

    def node_slices(node: str, spec: str, mode: MigMode) -> list[dict[str, Any]]:
        found = open_nvml(f"fake:{spec}", node=node, state_dir=None).discover()
        return render_slices("gpu.dradriver.io", node, build(found.inventory, mode).slices)

    slices = node_slices("h", "2xH100-80GB", MigMode.DYNAMIC)
    slices += node_slices("a", "1xA100-80GB:mig=on+1xA100-80GB", MigMode.DYNAMIC)
    slices += node_slices("l", "2xL4", MigMode.NONE)
    world = build_world(slices, [], [], nodes=[])
    values = quota_classes(world)
    assert {p["name"] for p in values["products"]} == {"h100-80gb-hbm3", "a100-sxm4-80gb", "l4"}
    # 1g.10gb is both an A100-80GB's and an H100-80GB's profile: one class per product.
    shared = [m for m in values["migProfiles"] if m["profile"] == "1g.10gb"]
    assert len(shared) == 2 and all("productName" in m for m in shared)
    classes = [d for d in render(helm, {"quotaClasses": values}) if d["kind"] == "DeviceClass"]
    by_name = {c["metadata"]["name"]: c for c in classes}
    checked = 0
    for p in values["products"]:
        cls = by_name[f"{p['name']}.gpu.dradriver.io"]
        want = {
            d.id
            for d in world.devices
            if d.cel.attributes["gpu.dradriver.io"]["type"] == "gpu"
            and d.product() == p["productName"]
        }
        got = {
            d.id
            for d in world.devices
            if all(
                Selector(s["cel"]["expression"]).evaluate(d.cel).matches
                for s in cls["spec"]["selectors"]
            )
        }
        assert got == want and want, p
        checked += 1
    for m in values["migProfiles"]:
        name = m.get("name") or m["profile"].replace(".", "").replace("+", "-")
        cls = by_name[f"{name}.mig.dradriver.io"]
        attrs = lambda d: d.cel.attributes["gpu.dradriver.io"]  # noqa: E731
        want = {
            d.id
            for d in world.devices
            if attrs(d)["type"] == "mig"
            and attrs(d)["profile"] == m["profile"]
            and d.product() == m.get("productName", d.product())
        }
        got = {
            d.id
            for d in world.devices
            if all(
                Selector(s["cel"]["expression"]).evaluate(d.cel).matches
                for s in cls["spec"]["selectors"]
            )
        }
        assert got == want and want, m
        checked += 1
    assert checked == len(classes) - 3  # beside the gpu, mig and imex-channel classes
    # `fleet --kueue` names the very classes the chart makes of these values.
    assert set(quota_class_names(values)) == set(by_name) - {
        "gpu.dradriver.io",
        "mig.dradriver.io",
        "imex-channel.dradriver.io",
    }
    with pytest.raises(HelmError, match="quotaClasses"):
        render(helm, {"quotaClasses": {"migProfiles": [{"profile": "big"}]}})


def test_nvidia_compatible_installs_under_nvidias_names(helm: Path) -> None:
    """nvidiaCompatible: the driver gpu.nvidia.com everywhere the chart names the driver
    (the plugin and the webhook's flags, the webhook's match, the claim-status grant), and
    NVIDIA's classes gpu.nvidia.com and mig.nvidia.com selecting its attribute domain."""
    docs = render(helm, {"nvidiaCompatible": True})
    (c,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in c["env"]}["DRADRIVER_DRIVER_NAME"] == (
        "gpu.nvidia.com"
    )
    ctrl = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--driver-name=gpu.nvidia.com" in ctrl["command"]
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["name"] == "resourceclaims.gpu.nvidia.com"
    assert any(
        'c.opaque.driver == "gpu.nvidia.com"' in m["expression"] for m in hook["matchConditions"]
    )
    classes = {
        d["metadata"]["name"]: " ".join(d["spec"]["selectors"][0]["cel"]["expression"].split())
        for d in docs
        if d["kind"] == "DeviceClass"
    }
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        assert classes[name] == (
            f'device.driver == "gpu.nvidia.com" && '
            f'device.attributes["gpu.nvidia.com"].type == "{kind}"'
        )
    assert "gpu.dradriver.io" not in classes
    grants = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert any(r.get("resourceNames") == ["gpu.nvidia.com"] for r in grants)
    with pytest.raises(HelmError, match=r"nvidiaCompatible installs the driver as gpu\.nvidia"):
        render(helm, {"nvidiaCompatible": True, "driverName": "gpu.example.com"})


def test_the_webhooks_list_of_nvidia_classes_is_the_codes() -> None:
    """The chart's CEL list (which claims the webhook sees under nvidiaCompatible) and the
    webhook's own (which it refuses) are one list."""
    from dradriver.controller.validate import NVIDIA_CLASSES_NOT_SERVED

    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    block = helpers.split('define "dradriver.nvidiaClassesNotServed"')[1].split("{{- end")[0]
    listed = yaml.safe_load(block.strip().removeprefix("-}}").strip())
    assert sorted(listed) == sorted(NVIDIA_CLASSES_NOT_SERVED)


def test_the_controllers_network_policy_admits_its_two_ports_only(helm: Path) -> None:
    """Off by default; on, connections reach the controller's pod on the webhook and
    health ports only, from the peers the values name (any, when they name none)."""
    assert not [d for d in render(helm) if d["kind"] == "NetworkPolicy"]
    block = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    docs = render(helm, {"controller": {"networkPolicy": {"enabled": True, "webhookFrom": block}}})
    policy = one(docs, "NetworkPolicy")
    pod = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "webhook", "protocol": "TCP"}], "from": block},
        {"ports": [{"port": "healthz", "protocol": "TCP"}]},
    ]
    ports = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {p["name"] for p in ports} == {"webhook", "healthz"}


def test_the_monitors_and_the_dashboard_follow_their_values(helm: Path) -> None:
    """Off by default (the PodMonitor CRD may not be there); on: a PodMonitor per component
    on the port its probes use, and the dashboard that test_dashboard.py checks against a
    real Prometheus, byte for byte, in a ConfigMap Grafana's sidecar picks up."""
    default = render(helm)
    assert not [d for d in default if d["kind"] in ("PodMonitor", "ConfigMap")]
    docs = render(
        helm,
        {
            "monitoring": {
                "podMonitors": {"enabled": True, "labels": {"release": "prometheus"}},
                "grafanaDashboard": {"enabled": True, "namespace": "grafana"},
            }
        },
    )
    for component, kind in (("kubelet-plugin", "DaemonSet"), ("controller", "Deployment")):
        monitor = one(docs, "PodMonitor", component)
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        pods = one(docs, kind)["spec"]["template"]
        assert (
            monitor["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
        )
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("healthz", "/metrics")
        assert "healthz" in {p["name"] for p in pods["spec"]["containers"][0]["ports"]}
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = REPO / "deploy" / "dashboards" / "fleet.json"
    assert json.loads(cm["data"]["dradriver-fleet.json"]) == json.loads(dashboard.read_text())
