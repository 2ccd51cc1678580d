"""ComputeDomains against the real API server, with a rack of three fake GB200 nodes (the
real kubelet's code, our real plugin publishing their GPUs and fabric cliques): two
nodes in one clique, one in another; and `dradriver controller` as real processes.

The CRD's rules are the API server's to enforce; the controller places each domain in
the clique with room, makes and owns its claim template, tracks the claims made from it
and cleans up on deletion, also across a restart, and two replicas share one Lease.

Claims made from a domain's template are written here as the resourceclaim controller,
the scheduler and the node would (the node side of IMEX comes with its own tests), so
what the controller reads is what the API server holds for real claims.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from dradriver.api import computedomain as cd
from dradriver.cli import main
from dradriver.k8s import Kube, KubeError, path_for
from fakenvml.imexctl import query
from tests.support.local_daemons import process_alive

from .helpers import (
    DAEMON_NAMESPACE,
    REPO,
    RES,
    Cluster,
    DradriverProcess,
    HollowNode,
    PluginProc,
    apply_object,
    ensure_device_classes,
    free_port,
    get_or_none,
    load_yaml,
    wait_for,
)

pytestmark = pytest.mark.e2e
DRIVER = "gpu.dradriver.io"
CDS = (cd.API_VERSION, cd.PLURAL)
DATA = Path(__file__).resolve().parents[1] / "data"
RACK = {
    "cd-a1": f"fake:@{DATA / 'gb200-clique-1.yaml'}",
    "cd-a2": f"fake:@{DATA / 'gb200-clique-1.yaml'}",
    "cd-b1": f"fake:@{DATA / 'gb200-clique-2.yaml'}",
}
# Each node's IMEX address (hollow nodes share one InternalIP): distinct loopback
# addresses, as the IMEX daemons of one machine need.
ADDRESS = {"cd-a1": "127.0.0.11", "cd-a2": "127.0.0.12", "cd-b1": "127.0.0.13"}


class Controller(DradriverProcess):
    def __init__(self, kubeconfig: str, tmp: Path, lease_ns: str, identity: str) -> None:
        self.kubeconfig, self.lease_ns, self.identity = kubeconfig, lease_ns, identity
        self.log_path = tmp / f"controller-{identity}.log"
        self.proc = None

    def start(self) -> None:
        self._spawn(
            [
                "controller",
                "--kubeconfig",
                self.kubeconfig,
                "--webhook-address",
                "127.0.0.1",
                "--webhook-port",
                str(free_port()),
                "--healthz-port",
                str(free_port()),
                # A webhook configuration nobody creates: this test is about domains.
                "--webhook-config-name",
                f"cd-e2e-{secrets.token_hex(3)}",
                "--namespace",
                self.lease_ns,
                "--leader-election-id",
                self.identity,
                "--log-level",
                "debug",
            ]
        )


class Rack(dict[str, str]):
    """node -> its fabric clique, as its plugin published it; and the nodes' processes."""

    kubelets: dict[str, HollowNode]
    plugins: dict[str, PluginProc]

    def imex_configs(self, node: str) -> list[Path]:
        return sorted((self.plugins[node].state_dir / "imex").glob("*/config.cfg"))


def _loopback_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def rack_of(
    kubeconfig: str,
    kube: Kube,
    nodes: dict[str, str],
    address: dict[str, str],
    plugin_args: tuple[str, ...] = (),
) -> Iterator[Rack]:
    """Hollow nodes with our plugin, each `nodes` spec's GPUs and `address` its IMEX
    address, until they have published their channels and labelled their Nodes."""
    ensure_device_classes(kube)
    tmp = Path(tempfile.mkdtemp(prefix="drk-cd-"))
    procs: list[DradriverProcess] = []
    out = Rack()
    out.kubelets, out.plugins = {}, {}
    # Every node's IMEX daemon on the same ports, each on its own address.
    first = next(iter(address.values()))
    imex = ["--imex-channels", "on", "--imex-port", str(_loopback_port(first))]
    imex += ["--imex-cmd-port", str(_loopback_port(first)), *plugin_args]
    try:
        for node, spec in nodes.items():
            kubelet = HollowNode(
                kubeconfig,
                node,
                tmp / node,
                extra_args=["--label", f"{cd.IMEX_ADDRESS_LABEL}={address[node]}"],
            )
            procs.append(kubelet)
            kubelet.start()
            kubelet.wait_node_ready(kube)
            plugin = PluginProc(kubeconfig, kubelet, spec, extra_args=imex)
            procs.append(plugin)
            out.kubelets[node], out.plugins[node] = kubelet, plugin
            plugin.start()
        cliques: dict[str, str] = {}

        def published() -> bool:
            slices = kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}"
            )
            for s in slices.get("items", []):
                node = s["spec"].get("nodeName")
                for d in s["spec"].get("devices") or []:
                    attrs = d.get("attributes", {})
                    if node in nodes and attrs.get("type", {}).get("string") == "imex-channel":
                        cliques[node] = attrs["nvlinkDomain"]["string"]
            return set(cliques) == set(nodes)

        wait_for(published, "the rack's slices with their cliques", 60)
        # Each plugin labels its Node with its clique: a job's podAffinity topologyKey.
        for node, clique in cliques.items():
            wait_for(
                lambda node=node, clique=clique: (
                    kube.get(path_for("v1", "nodes", name=node))["metadata"]
                    .get("labels", {})
                    .get(cd.NVLINK_DOMAIN_LABEL)
                    == clique
                ),
                f"node {node} labelled with its clique",
            )
        out.update(cliques)
        yield out
    finally:
        # Plugins first, then each kubelet with what its runtime runs (the IMEX daemons'
        # pods of a test that failed before its pods ended).
        for p in reversed(procs):
            p.stop()
        for node in nodes:
            with contextlib.suppress(KubeError):
                kube.delete(path_for("v1", "nodes", name=node), missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def rack(cluster: Cluster, kube: Kube) -> Iterator[Rack]:
    # This module is the path without binding conditions (prepare waits for the IMEX
    # daemon), which a line that has them on by default (1.36+) takes when told to;
    # test_computedomain_binding.py is the path with them.
    off = ("--imex-binding-conditions", "off")
    args = off if cluster.has("DRADeviceBindingConditions") else ()
    with rack_of(cluster.kubeconfig, kube, RACK, ADDRESS, plugin_args=args) as out:
        assert out["cd-a1"] == out["cd-a2"] != out["cd-b1"]
        yield out


@pytest.fixture(scope="module")
def lease_ns(kube: Kube) -> Iterator[str]:
    name = f"cd-lease-{secrets.token_hex(3)}"
    kube.create(path_for("v1", "namespaces"), {"metadata": {"name": name}})
    yield name
    kube.delete(path_for("v1", "namespaces", name=name), missing_ok=True)


@pytest.fixture
def controllers(
    cluster: Cluster, kube: Kube, lease_ns: str, namespace: str
) -> Iterator[Callable[[str], Controller]]:
    """Starts controller replicas; afterwards the test namespace's domains are deleted
    while one still runs (their finalizers would hold the namespace forever)."""
    tmp = Path(tempfile.mkdtemp(prefix="drk-ctl-"))
    started: list[Controller] = []

    def start(identity: str) -> Controller:
        c = Controller(cluster.kubeconfig, tmp, lease_ns, identity)
        started.append(c)
        c.start()
        return c

    yield start
    try:
        kube.delete_collection(path_for(*CDS, namespace))
        wait_for(
            lambda: not kube.list(path_for(*CDS, namespace)).get("items"),
            "the test's domains deleted",
            45,
        )
    finally:
        for c in started:
            c.stop()
            print(f"--- controller {c.identity}, last lines ---\n{c.log()[-4000:]}")
        shutil.rmtree(tmp, ignore_errors=True)


def domain(name: str, num_nodes: int, template: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "metadata": {"name": name},
        "spec": {
            "numNodes": num_nodes,
            "channel": {"resourceClaimTemplate": {"name": template or f"{name}-channel"}},
        },
    }


def ready_condition(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    obj = get_or_none(kube, path_for(*CDS, ns, name)) or {}
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), {})


def wait_reason(kube: Kube, ns: str, name: str, reason: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(
        lambda: (c := ready_condition(kube, ns, name)).get("reason") == reason and c,
        f"ComputeDomain {name} {reason}",
        timeout,
    )


def member_claim(
    kube: Kube, ns: str, template: dict[str, Any], pod: str, node: str, ready: bool
) -> str:
    """A claim made from `template` for `pod`, allocated on `node` and reserved, with the
    node's Ready condition on its channel: what the resourceclaim controller, the
    scheduler and the node write for a pod of the job. The pod exists (the resourceclaim
    controller drops reservations for pods that do not), held by a scheduling gate."""
    name = f"{pod}-channel"
    made = kube.create(
        path_for("v1", "pods", ns),
        {
            "metadata": {"name": pod},
            "spec": {
                "schedulingGates": [{"name": "e2e.dradriver.io/hold"}],
                "resourceClaims": [{"name": "channel", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "channel"}]},
                    }
                ],
            },
        },
    )
    kube.create(
        path_for(RES, "resourceclaims", ns),
        {
            "metadata": {"name": name, "labels": template["spec"]["metadata"]["labels"]},
            "spec": template["spec"]["spec"],
        },
    )
    obj = kube.get(path_for(RES, "resourceclaims", ns, name=name))
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "channel",
                        "driver": DRIVER,
                        "pool": node,
                        "device": "imex-channel",
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": pod, "uid": made["metadata"]["uid"]}],
        "devices": [
            {
                "driver": DRIVER,
                "pool": node,
                "device": "imex-channel",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": str(ready),
                        "reason": "IMEXDaemonReady" if ready else "IMEXDaemonStarting",
                        "message": "",
                        "lastTransitionTime": "2026-12-03T00:00:00Z",
                    }
                ],
            }
        ],
    }
    kube.replace(path_for(RES, "resourceclaims", ns, name=name, subresource="status"), obj)
    return name


def release(kube: Kube, ns: str, pod: str) -> None:
    """The pod is gone: the resourceclaim controller drops its reservation."""
    kube.delete(path_for("v1", "pods", ns, name=pod), grace_period=0)


def test_the_api_server_enforces_the_crds_rules(kube: Kube, namespace: str) -> None:
    def refused(body: dict[str, Any]) -> str:
        with pytest.raises(KubeError) as info:
            kube.create(path_for(*CDS, namespace), body)
        assert info.value.status == 422, info.value
        return info.value.message

    assert "spec.numNodes" in refused(domain("zero", 0))
    assert "must be a DNS subdomain" in refused(domain("bad", 1, template="Bad_Name"))
    no_channel = domain("nochan", 1)
    del no_channel["spec"]["channel"]
    assert "spec.channel: Required value" in refused(no_channel)
    kube.create(path_for(*CDS, namespace), domain("fixed", 2))
    with pytest.raises(KubeError) as info:
        kube.patch(path_for(*CDS, namespace, "fixed"), {"spec": {"numNodes": 3}})
    assert "spec is immutable" in info.value.message


def test_domains_are_placed_tracked_and_cleaned_up(
    kube: Kube, namespace: str, rack: Rack, controllers: Callable[[str], Controller]
) -> None:
    controllers("one")
    ns = namespace
    two, one = rack["cd-a1"], rack["cd-b1"]
    kube.create(path_for(*CDS, ns), domain("train", 2))
    cond = wait_reason(kube, ns, "train", "WaitingForPods")
    assert cond["status"] == "False"
    train = kube.get(path_for(*CDS, ns, "train"))
    assert cd.FINALIZER in train["metadata"]["finalizers"]
    assert (train["status"]["clique"], train["status"]["channel"]) == (two, 0)
    tmpl = kube.get(path_for(RES, "resourceclaimtemplates", ns, name="train-channel"))
    (owner,) = tmpl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == (cd.KIND, train["metadata"]["uid"])
    (req,) = tmpl["spec"]["spec"]["devices"]["requests"]
    assert f'nvlinkDomain == "{two}"' in req["exactly"]["selectors"][0]["cel"]["expression"]

    # Best fit: a one-node job goes to the one-node clique, keeping the pair whole.
    kube.create(path_for(*CDS, ns), domain("solo", 1))
    wait_reason(kube, ns, "solo", "WaitingForPods")
    assert kube.get(path_for(*CDS, ns, "solo"))["status"]["clique"] == one
    # Three nodes: no clique has them.
    kube.create(path_for(*CDS, ns), domain("big", 3))
    cond = wait_reason(kube, ns, "big", "NoCliqueWithRoom")
    assert "spec.numNodes is 3" in cond["message"]
    assert (
        get_or_none(kube, path_for(RES, "resourceclaimtemplates", ns, name="big-channel")) is None
    )
    # A template that is not the domain's is left alone.
    kube.create(
        path_for(RES, "resourceclaimtemplates", ns),
        {"metadata": {"name": "taken"}, "spec": {"spec": {"devices": {"requests": []}}}},
    )
    kube.create(path_for(*CDS, ns), domain("late", 1, template="taken"))
    assert "already exists" in wait_reason(kube, ns, "late", "TemplateExists")["message"]

    # The job's pods: one node joins ready, then the other.
    a = member_claim(kube, ns, tmpl, "train-0", "cd-a1", ready=True)
    cond = wait_reason(kube, ns, "train", "WaitingForNodes")
    assert cond["message"] == "1 of 2 nodes ready; joined: cd-a1"
    b = member_claim(kube, ns, tmpl, "train-1", "cd-a2", ready=True)
    cond = wait_reason(kube, ns, "train", "NodesReady")
    assert cond["status"] == "True"
    nodes = kube.get(path_for(*CDS, ns, "train"))["status"]["nodes"]
    assert nodes == [
        {"name": n, "clique": two, "address": ADDRESS[n], "ready": True, "claim": c}
        for n, c in (("cd-a1", a), ("cd-a2", b))
    ]

    # Deleted while its pods run: the template goes, the domain waits for the pods.
    kube.delete(path_for(*CDS, ns, "train"))
    cond = wait_reason(kube, ns, "train", "Deleting")
    assert "2 claim(s)" in cond["message"]
    wait_for(
        lambda: (
            get_or_none(kube, path_for(RES, "resourceclaimtemplates", ns, name="train-channel"))
            is None
        ),
        "the template deleted",
    )
    release(kube, ns, "train-0")
    release(kube, ns, "train-1")
    wait_for(lambda: get_or_none(kube, path_for(*CDS, ns, "train")) is None, "the domain gone")
    assert get_or_none(kube, path_for(RES, "resourceclaimtemplates", ns, name="taken")) is not None


def test_a_deletion_while_the_controller_is_down_is_finished_after_it_starts(
    kube: Kube, namespace: str, rack: Rack, controllers: Callable[[str], Controller]
) -> None:
    ctl = controllers("first")
    kube.create(path_for(*CDS, namespace), domain("brief", 1))
    wait_reason(kube, namespace, "brief", "WaitingForPods")
    ctl.stop(signal.SIGKILL)
    kube.delete(path_for(*CDS, namespace, "brief"))
    assert get_or_none(kube, path_for(*CDS, namespace, "brief")) is not None  # the finalizer
    controllers("second")  # takes over once the killed one's lease runs out
    wait_for(
        lambda: get_or_none(kube, path_for(*CDS, namespace, "brief")) is None, "the domain gone", 45
    )
    assert (
        get_or_none(kube, path_for(RES, "resourceclaimtemplates", namespace, name="brief-channel"))
        is None
    )


def test_two_replicas_one_writer_and_a_clean_handover(
    kube: Kube,
    namespace: str,
    lease_ns: str,
    rack: Rack,
    controllers: Callable[[str], Controller],
) -> None:
    lease = path_for("coordination.k8s.io/v1", "leases", lease_ns, name="dradriver-controller")

    def holder() -> str:
        return str(((get_or_none(kube, lease) or {}).get("spec") or {}).get("holderIdentity") or "")

    first = controllers("left")
    wait_for(lambda: holder() == "left", "the first replica leading", 45)
    second = controllers("right")
    kube.create(path_for(*CDS, namespace), domain("shared", 1))
    wait_reason(kube, namespace, "shared", "WaitingForPods")
    assert "domain status" not in second.log()  # the follower wrote nothing
    first.stop()  # SIGTERM: it hands the lease over
    wait_for(lambda: holder() == "right", "the second replica leading", 10)
    kube.delete(path_for(*CDS, namespace, "shared"))
    wait_for(
        lambda: get_or_none(kube, path_for(*CDS, namespace, "shared")) is None, "the domain gone"
    )
    assert "released the lease" in first.log()


def job_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"job": "train"}},
        "spec": {
            "resourceClaims": [{"name": "channel", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "channel"}]},
                }
            ],
        },
    }


def running(kube: Kube, ns: str, pod: str, timeout: float = 90) -> dict[str, Any]:
    path = path_for("v1", "pods", ns, name=pod)
    return wait_for(
        lambda: (p := get_or_none(kube, path)) and p["status"].get("phase") == "Running" and p,
        f"pod {pod} running",
        timeout,
    )


def events_of(kube: Kube, ns: str, pod: str) -> str:
    items = kube.list(path_for("v1", "events", ns), fieldSelector=f"involvedObject.name={pod}")
    return "\n".join(e.get("message", "") for e in items.get("items", []))


def test_a_two_node_job_runs_in_one_imex_domain(
    kube: Kube, namespace: str, rack: Rack, controllers: Callable[[str], Controller]
) -> None:
    """examples/claims/computedomain-job.yaml as a user applies it: the real scheduler
    allocates each pod's channel claim from the domain's template (both pods on the pair,
    one a node; the other clique never) and its four GPUs on the same node; each node's
    plugin starts its IMEX daemon once both nodes have joined, with both as peers; the
    pods run with the channel's device node and their GPUs; the domain reads Ready;
    deleting the pods stops the daemons and leaves no file behind. Each daemon is a pod of
    its own: cd-a1's plugin, run as the init of its own PID namespace as in its
    container, SIGKILLed under the running job, leaves both daemons running and
    connected, and its next instance adopts them (Q20)."""
    controllers("sched")
    ns = namespace
    a1 = rack.plugins["cd-a1"]
    a1.stop()
    a1.prefix = ("unshare", "--pid", "--fork", "--kill-child")
    a1.start()
    wait_for(a1.ready, "cd-a1's plugin in its own PID namespace", 30)
    domain_doc, *rest = load_yaml(REPO / "examples" / "claims" / "computedomain-job.yaml")
    assert (domain_doc["kind"], domain_doc["metadata"]["name"]) == (cd.KIND, "train")
    apply_object(kube, domain_doc, ns)
    # The template the pods name exists from here: made at once, the resourceclaim
    # controller would retry their claims with a growing backoff until it does.
    wait_reason(kube, ns, "train", "WaitingForPods")
    for doc in rest:
        apply_object(kube, doc, ns)
    names = [d["metadata"]["name"] for d in rest if d["kind"] == "Pod"]
    assert names == ["train-0", "train-1"]
    pods = [running(kube, ns, n) for n in names]
    assert {p["spec"]["nodeName"] for p in pods} == {"cd-a1", "cd-a2"}
    cond = wait_reason(kube, ns, "train", "NodesReady")
    assert cond["status"] == "True" and cond["message"] == "2 of 2 nodes ready: cd-a1, cd-a2"
    for p in pods:
        node = p["spec"]["nodeName"]
        made = {s["name"]: s["resourceClaimName"] for s in p["status"]["resourceClaimStatuses"]}
        assert set(made) == {"channel", "gpus"}
        results = {
            request: kube.get(path_for(RES, "resourceclaims", ns, name=claim))["status"][
                "allocation"
            ]["devices"]["results"]
            for request, claim in made.items()
        }
        assert [(r["pool"], r["device"]) for r in results["channel"]] == [(node, "imex-channel")]
        gpus = {r["device"] for r in results["gpus"]}
        assert len(gpus) == 4 and {r["pool"] for r in results["gpus"]} == {node}
        rec = rack.kubelets[node].container(p["metadata"]["uid"], "main")
        assert rec is not None
        assert "/dev/nvidia-caps-imex-channels/channel0" in json.dumps(rec), rec
        assert "DRADRIVER_IMEX_CHANNEL=0" in rec["env"]
        visible = [e for e in rec["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-")]
        assert [len(e.split(",")) for e in visible] == [4], rec["env"]
        # The node's daemon: both nodes as peers, connected to the other.
        (config,) = rack.imex_configs(node)
        assert (config.parent / "nodes_config.cfg").read_text().split() == sorted(
            [ADDRESS["cd-a1"], ADDRESS["cd-a2"]]
        )
        wait_for(
            lambda config=config: all(n["connected"] for n in query(config)["nodes"]),
            f"{node}'s IMEX daemon connected to its peer",
        )
    # Each node's daemon is a pod of its own there, in the node's network.
    daemons = {n: imex_pods(kube, n) for n in ("cd-a1", "cd-a2", "cd-b1")}
    assert [len(daemons[n]) for n in daemons] == [1, 1, 0]
    assert all(p["spec"].get("hostNetwork") for n in ("cd-a1", "cd-a2") for p in daemons[n])
    pids = rack.kubelets["cd-a1"].host_processes() + rack.kubelets["cd-a2"].host_processes()
    assert len(pids) == 2
    assert rack.imex_configs("cd-b1") == []
    uids = sorted(p["metadata"]["uid"] for n in ("cd-a1", "cd-a2") for p in daemons[n])
    a1.stop(signal.SIGKILL)
    assert all(process_alive(p) for p in pids)
    a1.start()
    wait_for(a1.ready, "cd-a1's plugin in a new PID namespace", 30)
    assert (
        sorted(p["metadata"]["uid"] for n in ("cd-a1", "cd-a2") for p in imex_pods(kube, n)) == uids
    )
    assert sorted(
        rack.kubelets["cd-a1"].host_processes() + rack.kubelets["cd-a2"].host_processes()
    ) == sorted(pids)
    assert "IMEX daemon started again" not in a1.log()
    for n in ("cd-a1", "cd-a2"):
        (config,) = rack.imex_configs(n)
        assert all(peer["connected"] for peer in query(config)["nodes"]), query(config)
    for n in names:
        kube.delete(path_for("v1", "pods", ns, name=n))
    for n in names:
        wait_for(
            lambda n=n: get_or_none(kube, path_for("v1", "pods", ns, name=n)) is None,
            f"pod {n} gone",
            60,
        )
    wait_for(lambda: not any(process_alive(p) for p in pids), "the IMEX daemons stopped", 30)
    assert imex_pods(kube, "cd-a1") == imex_pods(kube, "cd-a2") == []
    assert rack.imex_configs("cd-a1") == rack.imex_configs("cd-a2") == []


def test_a_daemon_that_never_gets_ready_keeps_its_pod_from_starting_and_says_why(
    kube: Kube, namespace: str, rack: Rack, controllers: Callable[[str], Controller]
) -> None:
    """Without the binding-condition gates, the pod waits in ContainerCreating: its
    prepare fails, naming the IMEX layer, and the kubelet retries."""
    controllers("stuck")
    faults = rack.plugins["cd-b1"].state_dir / "fake-imex-faults.json"
    faults.write_text(json.dumps({"neverReady": True}))
    try:
        ns = namespace
        kube.create(path_for(*CDS, ns), domain("stuck", 1))
        wait_reason(kube, ns, "stuck", "WaitingForPods")
        kube.create(path_for("v1", "pods", ns), job_pod("stuck-0", "stuck-channel"))
        said = wait_for(
            lambda: "IMEX layer" in (e := events_of(kube, ns, "stuck-0")) and e,
            "the pod's event naming the IMEX layer",
            60,
        )
        assert "did not answer READY" in said and "nvidia-imex-ctl -q: UNAVAILABLE" in said
        pod = kube.get(path_for("v1", "pods", ns, name="stuck-0"))
        assert pod["spec"]["nodeName"] == "cd-b1" and pod["status"].get("phase") == "Pending"
        # What `dradriver explain` says of it: the IMEX layer, and where to look.
        out = io.StringIO()
        with redirect_stdout(out):
            main(
                [
                    "explain",
                    "pod/stuck-0",
                    "-n",
                    ns,
                    "--kubeconfig",
                    rack.plugins["cd-b1"].kubeconfig,
                ]
            )
        (verdict,) = [x for x in out.getvalue().splitlines() if x.startswith("=> ")]
        assert verdict.startswith("=> IMEX: the pod is on cd-b1, waiting for its ComputeDomain")
        assert "nvidia-imex-ctl -N" in verdict
        cond = wait_reason(kube, ns, "stuck", "WaitingForNodes")
        assert "IMEX daemon not ready yet on cd-b1" in cond["message"]
        kube.delete(path_for("v1", "pods", ns, name="stuck-0"), grace_period=0)
    finally:
        faults.unlink()
    wait_for(lambda: rack.imex_configs("cd-b1") == [], "no daemon left on cd-b1", 30)


def imex_pods(kube: Kube, node: str) -> list[dict[str, Any]]:
    """The IMEX daemon pods on `node` (kubeletplugin/daemons/), as the API server holds them."""
    return list(
        kube.list(
            path_for("v1", "pods", DAEMON_NAMESPACE),
            labelSelector="app.kubernetes.io/component=imex-daemon",
            fieldSelector=f"spec.nodeName={node}",
        )["items"]
    )
