"""All or nothing (Q18): two training jobs of four pods, each pod taking a whole 8-GPU node
through a ResourceClaimTemplate, on six hollow nodes whose fake H100s the plugin publishes
and prepares (48 GPUs: room for one job and a half).

Without a gang the scheduler places pods one at a time: the jobs' pods, arriving
interleaved, take three nodes each, and both jobs hold 24 GPUs that do nothing (the
first collective of each waits forever for its fourth rank). With Kueue (v0.17, built
from its Go module) and a ClusterQueue whose quota is the fleet's 48 GPUs, the second job
is not admitted while the first runs: it has no pod and holds no GPU until the first is
done, then runs whole. Where quota is not enough (GPUs held outside the queue), Kueue's
waitForPodsReady evicts a job whose pods are not all ready in time, and requeues it: it
gives back what it held, and runs whole once it fits.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dradriver.commands.explain import gather
from dradriver.commands.fleet import gather as fleet_gather
from dradriver.commands.fleet import render as fleet_render
from dradriver.k8s import Kube, KubeError, path_for
from dradriver.k8s.lines import OLDEST
from dradriver_dev import kueue
from fakenvml import load

from .helpers import (
    REPO,
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    load_yaml,
    new_namespace,
    wait_for,
)

pytestmark = pytest.mark.e2e

D = "gpu.dradriver.io"
NODES, GPUS, PODS = 6, 8, 4
TEMPLATE = "eight-gpus"
GATE = "dradriver.io/test-order"
K = kueue.API
SCHEDULING = "scheduling.k8s.io/v1beta1"
EXAMPLES = REPO / "examples" / "gang"
# waitForPodsReady as a platform team sets it for GPU jobs, with times a test can wait
# for: a job whose pods are not all ready within the timeout is evicted and requeued
# (after 5 s, then 10 s, ...), and no other job is admitted while one admitted is not
# ready (blockAdmission), so two jobs never wait on each other's GPUs.
PODS_READY = {
    "timeout": "20s",
    "blockAdmission": True,
    "requeuingStrategy": {
        "timestamp": "Eviction",
        "backoffBaseSeconds": 5,
        "backoffMaxSeconds": 20,
    },
}


@dataclass
class SixNodes:
    kube: Kube
    nodes: list[NodeUnderTest]
    gpus: int = GPUS  # per node, and per rank: a rank takes a node's GPUs

    @property
    def names(self) -> list[str]:
        return [n.kubelet.node for n in self.nodes]

    def pod_spec(self) -> dict[str, Any]:
        """A pod taking a rank's devices (a node's GPUs), on one of these nodes, running
        until it is stopped (the hollow node's containers never exit)."""
        return {
            **self.placement(),
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [
                {
                    "name": "rank",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
        }

    def placement(self, *, gated: bool = False) -> dict[str, Any]:
        """What keeps a pod on these nodes (and, `gated`, from the scheduler until its
        gate is lifted)."""
        return {
            "terminationGracePeriodSeconds": 1,
            "schedulingGates": [{"name": GATE}] if gated else [],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": self.names,
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        }


@dataclass
class Jobs:
    """The jobs of one namespace and what they hold."""

    fleet: SixNodes
    ns: str

    @property
    def kube(self) -> Kube:
        return self.fleet.kube

    def submit(
        self,
        name: str,
        *,
        queue: str | None = None,
        gated: bool = False,
        group: bool = False,
        ranks: int = PODS,
        topology: str | None = None,
    ) -> None:
        """The example Job (examples/gang/) of `ranks` ranks, named `name`, placed on these
        nodes: to Kueue's `queue` (created suspended, as Kueue's Job webhook, not installed
        here, would make it), or straight to the scheduler (with `group`, as a gang: the
        example's PodGroup, named like it, placing all its ranks or none, in one domain of
        the node label `topology` where one is given)."""
        example = EXAMPLES / ("podgroup-training-job.yaml" if group else "kueue-training-job.yaml")
        docs = {d["kind"]: d for d in load_yaml(example)}
        if group:
            pg = docs["PodGroup"]
            pg["metadata"]["name"] = name
            pg["spec"]["schedulingPolicy"]["gang"]["minCount"] = ranks
            if topology:
                pg["spec"]["schedulingConstraints"] = {"topology": [{"key": topology}]}
            self.kube.create(path_for(SCHEDULING, "podgroups", self.ns), pg)
        job = docs["Job"]
        job["metadata"]["name"] = name
        job["metadata"]["labels"] = {kueue.QUEUE_LABEL: queue} if queue else {}
        job["spec"].update(suspend=queue is not None, parallelism=ranks, completions=ranks)
        pod = job["spec"]["template"]["spec"]
        assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == TEMPLATE
        pod.update(self.fleet.placement(gated=gated))
        if group:
            pod["schedulingGroup"] = {"podGroupName": name}
        self.kube.create(path_for("batch/v1", "jobs", self.ns), job)

    def pods(self, job: str) -> list[dict[str, Any]]:
        items = self.kube.list(path_for("v1", "pods", self.ns), labelSelector=f"job-name={job}")
        return sorted(items["items"], key=lambda p: str(p["metadata"]["name"]))

    def running(self, job: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(job)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def unschedulable(self, job: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(job)
            if any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p["status"].get("conditions") or []
            )
        ]

    def held(self, job: str) -> list[str]:
        """The GPUs the claims of the job's pods hold (allocated), as pool/device."""
        mine = {str(p["metadata"]["name"]) for p in self.pods(job)}
        out = []
        for c in self.kube.list(path_for(RES, "resourceclaims", self.ns))["items"]:
            owners = {o["name"] for o in c["metadata"].get("ownerReferences") or []}
            if owners & mine and (alloc := (c.get("status") or {}).get("allocation")):
                out += [f"{r['pool']}/{r['device']}" for r in alloc["devices"]["results"]]
        return out

    def node_labels(self, node: str) -> dict[str, str]:
        return dict(
            self.kube.get(path_for("v1", "nodes", name=node))["metadata"].get("labels") or {}
        )

    def held_by_pod(self, pod: str) -> bool:
        """Whether the pod's claim is allocated."""
        for c in self.kube.list(path_for(RES, "resourceclaims", self.ns))["items"]:
            owners = {o["name"] for o in c["metadata"].get("ownerReferences") or []}
            if pod in owners and (c.get("status") or {}).get("allocation"):
                return True
        return False

    def ungate(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.kube.patch(
            path_for("v1", "pods", self.ns, name=name),
            [{"op": "remove", "path": "/spec/schedulingGates"}],
            patch_type="json",
        )

    def scheduled(self, pod: dict[str, Any]) -> bool:
        p = self.kube.get(path_for("v1", "pods", self.ns, name=pod["metadata"]["name"]))
        return bool(p["spec"].get("nodeName"))

    def remove(self, job: str) -> None:
        """The job done: deleted, its pods with it (as its TTL after finishing would)."""
        self.kube.request(
            "DELETE",
            path_for("batch/v1", "jobs", self.ns, name=job),
            body={"propagationPolicy": "Background"},
        )
        wait_for(lambda: not self.pods(job), f"the pods of {job} gone", 60)

    def nothing_left(self) -> None:
        """No claim of this namespace left, and no plugin with anything prepared."""
        wait_for(
            lambda: not self.kube.list(path_for(RES, "resourceclaims", self.ns))["items"],
            "every claim gone",
            60,
        )
        for n in self.fleet.nodes:
            wait_for(lambda n=n: n.checkpoint_claims() == {}, f"{n.kubelet.node} unprepared", 30)


@contextlib.contextmanager
def six_nodes(
    kubeconfig: str,
    kube: Kube,
    devices: list[str] | None = None,
    gpus: int = GPUS,
    *,
    mig_mode: str = "none",
) -> Iterator[SixNodes]:
    """Six hollow nodes (of eight fake H100s each, unless `devices` says per node), with
    the plugin."""
    ensure_device_classes(kube)
    tmp = Path(tempfile.mkdtemp(prefix="drk-"))
    started: list[tuple[HollowNode, PluginProc]] = []
    try:
        for spec in devices or [f"fake:{GPUS}xH100-80GB"] * NODES:
            name = f"gang-{secrets.token_hex(3)}"
            kubelet = HollowNode(kubeconfig, name, tmp / name)
            kubelet.start()
            plugin = PluginProc(kubeconfig, kubelet, spec, mig_mode)
            started.append((kubelet, plugin))
            kubelet.wait_node_ready(kube)
            plugin.start()
        for _, plugin in started:
            wait_for(plugin.ready, "the plugin ready", 60)
        yield SixNodes(kube, [NodeUnderTest(kube, "default", k, p) for k, p in started], gpus)
    finally:
        for kubelet, plugin in started:
            plugin.stop()
            kubelet.stop()
            with contextlib.suppress(KubeError):
                kube.delete(path_for("v1", "nodes", name=kubelet.node), missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def jobs_on(
    kubeconfig: str,
    kube: Kube,
    devices: list[str] | None = None,
    gpus: int = GPUS,
    *,
    mig_mode: str = "none",
    rank: dict[str, Any] | None = None,
) -> Iterator[Jobs]:
    """The nodes, and a namespace for jobs with the claim template of a rank: `rank` (a
    request's `exactly`), a node's `gpus` GPUs by default."""
    rank = rank or {"deviceClassName": D, "count": gpus}
    with six_nodes(kubeconfig, kube, devices, gpus, mig_mode=mig_mode) as fleet:
        ns = new_namespace(kube, f"gang-{secrets.token_hex(3)}")
        kube.create(
            path_for(RES, "resourceclaimtemplates", ns),
            {
                "metadata": {"name": TEMPLATE},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": rank}]}}},
            },
        )
        j = Jobs(fleet, ns)
        try:
            yield j
        finally:
            for job in kube.list(path_for("batch/v1", "jobs", ns))["items"]:
                j.remove(job["metadata"]["name"])
            kube.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


@pytest.fixture
def jobs(cluster: Cluster, kube: Kube) -> Iterator[Jobs]:
    """The control case and Kueue's path, on the oldest line only: they ask nothing of
    the line beyond DRA, and the newest runs the scheduler's own gang instead."""
    if cluster.line.name != OLDEST.name:
        pytest.skip(f"Kueue's path and the control case run on {OLDEST.name}")
    with jobs_on(cluster.kubeconfig, kube) as j:
        yield j


@pytest.fixture
def gang_jobs(gang_cluster: Cluster) -> Iterator[Jobs]:
    kube = Kube.from_kubeconfig(gang_cluster.kubeconfig)
    try:
        with jobs_on(gang_cluster.kubeconfig, kube) as j:
            yield j
    finally:
        kube.close()


def test_without_a_gang_two_jobs_each_hold_half_and_neither_runs(jobs: Jobs) -> None:
    """The problem, shown: the scheduler places each pod as it comes, so two jobs whose
    pods come interleaved (as two Jobs submitted together do; the order is fixed here by
    scheduling gates, lifted one pod at a time) take three nodes each. 48 GPUs are held
    and no job can start its work."""
    for job in ("a", "b"):
        jobs.submit(job, gated=True)
    ranks = {
        job: wait_for(
            lambda job=job: p if len(p := jobs.pods(job)) == PODS else None,
            f"the {PODS} pods of job {job}",
            60,
        )
        for job in ("a", "b")
    }
    for i in range(PODS):
        for job in ("a", "b"):
            pod = ranks[job][i]
            jobs.ungate(pod)
            if i < PODS - 1:
                wait_for(lambda pod=pod: jobs.scheduled(pod), f"{pod['metadata']['name']} placed")
    for job in ("a", "b"):
        wait_for(lambda job=job: len(jobs.running(job)) == PODS - 1, f"3 ranks of {job} running")
        wait_for(lambda job=job: len(jobs.unschedulable(job)) == 1, f"a rank of {job} waiting", 60)
    held = {job: jobs.held(job) for job in ("a", "b")}
    assert {job: len(g) for job, g in held.items()} == {"a": 24, "b": 24}
    assert len(set(held["a"]) | set(held["b"])) == NODES * GPUS  # the whole fleet, idle
    nodes = {p["spec"]["nodeName"] for job in ("a", "b") for p in jobs.running(job)}
    assert nodes == set(jobs.fleet.names)
    # explain, on the rank that waits: its Job is a gang placed in part, and what it lacks.
    (waiting,) = jobs.unschedulable("a")
    name = waiting["metadata"]["name"]
    placed = ", ".join(sorted(p["metadata"]["name"] for p in jobs.running("a")))
    said = explained(jobs, name)
    assert said.startswith(
        f"gang: pod {jobs.ns}/{name} waits for its gang, Job {jobs.ns}/a: 3 of 4 pods placed "
        f"({placed}), holding their devices until the rest are; no node has room for another "
        "such pod now, 1 needed; what it lacks: all 48 devices matching request gpus are taken"
    ), said
    # fleet counts what the two half-placed jobs hold as stranded, with reason and cost.
    report = fleet_gather(jobs.kube, 3.0, jobs.ns)
    held = [s for s in report.stranded if s.reason == "partial-gang"]
    assert {s.node for s in held} == set(jobs.fleet.names)
    assert sorted((s.detail, s.gpus) for s in held) == sorted(
        (f"held by Job {jobs.ns}/{job}, 3 of 4 pods placed: they wait for the rest", GPUS)
        for job in ("a", "b")
        for _ in range(3)
    )
    assert (report.stranded_gpus, report.cost_per_hour()) == (48, 144.0)
    assert (
        "stranded: 48 GPUs: 0 free GPUs no Pending claim can use where they are, and 48 "
        "held by gangs placed in part" in fleet_render(report)
    )


def explained(jobs: Jobs, pod: str) -> str:
    """What `dradriver explain pod/POD` concludes."""
    report = gather(jobs.kube, f"pod/{pod}", jobs.ns)
    assert report.finding is not None, report
    return report.finding.line()


def cluster_queue(name: str, flavor: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": K,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": [D],
                    "flavors": [{"name": flavor, "resources": [{"name": D, "nominalQuota": gpus}]}],
                }
            ],
        },
    }


@contextlib.contextmanager
def queue_of_the_fleet(jobs: Jobs, cluster: Cluster) -> Iterator[str]:
    """Kueue with waitForPodsReady, charging each device of our class as one `D`, and a
    LocalQueue in the jobs' namespace whose ClusterQueue's quota is the fleet's GPUs."""
    kube, suffix = jobs.kube, secrets.token_hex(3)
    work = Path(tempfile.mkdtemp(prefix="dradriver-kueue-"))
    k = kueue.start(cluster.kubeconfig, {D: [D]}, work=work, pods_ready=PODS_READY)
    made = [
        path_for(K, "resourceflavors", name=f"h100-{suffix}"),
        path_for(K, "clusterqueues", name=f"fleet-{suffix}"),
    ]
    try:
        kube.create(
            path_for(K, "resourceflavors"),
            {"apiVersion": K, "kind": "ResourceFlavor", "metadata": {"name": f"h100-{suffix}"}},
        )
        kube.create(
            path_for(K, "clusterqueues"),
            cluster_queue(f"fleet-{suffix}", f"h100-{suffix}", NODES * GPUS),
        )
        kube.create(
            path_for(K, "localqueues", jobs.ns),
            {
                "apiVersion": K,
                "kind": "LocalQueue",
                "metadata": {"name": "training"},
                "spec": {"clusterQueue": f"fleet-{suffix}"},
            },
        )
        yield "training"
    finally:
        for job in kube.list(path_for("batch/v1", "jobs", jobs.ns))["items"]:
            jobs.remove(job["metadata"]["name"])
        for p in reversed(made):
            with contextlib.suppress(KubeError):
                kube.delete(p, missing_ok=True)
        k.stop()
        print(f"--- kueue, last lines ---\n{k.log()[-6000:]}")
        shutil.rmtree(work, ignore_errors=True)


def workload(jobs: Jobs, job: str) -> dict[str, Any]:
    return kueue.workload(jobs.kube, jobs.ns, job)


condition = kueue.condition


def test_kueue_runs_one_job_whole_and_the_other_holds_nothing_until_it_fits(
    jobs: Jobs, cluster: Cluster
) -> None:
    with queue_of_the_fleet(jobs, cluster) as queue:
        jobs.submit("a", queue=queue)
        wait_for(lambda: condition(workload(jobs, "a"), "Admitted"), "job a admitted", 60)
        jobs.submit("b", queue=queue)
        wait_for(lambda: len(jobs.running("a")) == PODS, "job a's 4 ranks running", 90)
        wait_for(lambda: condition(workload(jobs, "a"), "PodsReady"), "job a ready", 30)
        # b asks for 32 of the 16 GPUs left of the quota: not admitted, so no pod of it
        # exists and it holds nothing, for as long as a runs.
        w = wait_for(lambda: workload(jobs, "b"), "job b's Workload", 30)
        reserved = wait_for(
            lambda: condition(workload(jobs, "b"), "QuotaReserved", "False"),
            "job b waiting for quota",
            30,
        )
        assert "insufficient" in reserved["message"].lower(), reserved
        assert condition(w, "Admitted") is None
        assert (jobs.pods("b"), jobs.held("b"), len(jobs.held("a"))) == ([], [], 32)
        # a is done: b runs, whole.
        jobs.remove("a")
        wait_for(lambda: len(jobs.running("b")) == PODS, "job b's 4 ranks running", 90)
        assert len(jobs.held("b")) == 32
        jobs.remove("b")
    jobs.nothing_left()


def test_kueue_evicts_a_job_not_ready_in_time_and_it_gives_back_what_it_held(
    jobs: Jobs, cluster: Cluster
) -> None:
    """Quota is not placement: with three nodes' GPUs taken outside the queue (by pods
    Kueue does not manage), a job within quota gets three of its four ranks placed.
    waitForPodsReady evicts it when its time is up: its pods go, its GPUs are free, it is
    requeued; once the GPUs are back it is admitted again and runs whole."""
    kube = jobs.kube
    with queue_of_the_fleet(jobs, cluster) as queue:
        outside = [f"outside-{i}" for i in range(3)]
        for name in outside:
            kube.create(
                path_for("v1", "pods", jobs.ns),
                {"metadata": {"name": name}, "spec": jobs.fleet.pod_spec()},
            )
        for name in outside:
            wait_for(
                lambda name=name: jobs.scheduled({"metadata": {"name": name}}),
                f"{name} placed",
                60,
            )
        jobs.submit("a", queue=queue)
        wait_for(lambda: len(jobs.running("a")) == PODS - 1, "3 ranks of a running", 90)
        assert len(jobs.unschedulable("a")) == 1
        evicted = wait_for(lambda: condition(workload(jobs, "a"), "Evicted"), "a evicted", 60)
        assert evicted["reason"] == "PodsReadyTimeout", evicted
        wait_for(lambda: not jobs.held("a"), "a's GPUs given back", 60)
        for name in outside:
            kube.delete(path_for("v1", "pods", jobs.ns, name=name))
        wait_for(lambda: len(jobs.running("a")) == PODS, "a's 4 ranks running", 120)
        assert len(jobs.held("a")) == 32
        jobs.remove("a")
    jobs.nothing_left()


def test_the_schedulers_gang_places_a_job_whole_or_holds_nothing(gang_jobs: Jobs) -> None:
    """1.37's gang scheduling (GenericWorkload): each job a PodGroup with minCount 4. Both
    submitted at once, one is placed whole and the other not at all: none of its pods
    bound, none of its claims allocated, for as long as the first runs; then it runs
    whole. Nothing is left prepared."""
    jobs = gang_jobs
    for job in ("a", "b"):
        jobs.submit(job, group=True)

    def whole() -> str | None:
        return next((j for j in ("a", "b") if len(jobs.running(j)) == PODS), None)

    first = wait_for(whole, "one job's 4 ranks running", 90)
    second = "b" if first == "a" else "a"
    assert len(jobs.held(first)) == PODS * GPUS
    # The other waits whole: nothing bound, nothing allocated, while the first runs.
    wait_for(lambda: len(jobs.pods(second)) == PODS, f"job {second}'s pods", 30)
    for _ in range(30):
        assert [p["metadata"]["name"] for p in jobs.pods(second) if p["spec"].get("nodeName")] == []
        assert jobs.held(second) == []
        time.sleep(0.2)
    # Held back by its gang (a pod group's field the API server keeps only with the gate
    # on), and the scheduler says so.
    waiting = jobs.pods(second)
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in waiting} == {second}
    said = [c.get("message", "") for p in waiting for c in p["status"].get("conditions") or []]
    assert any(f"minCount ({PODS}) cannot be satisfied" in m for m in said), said
    # explain: the pod waits for its gang, and the fleet has room for two of its four.
    name = waiting[0]["metadata"]["name"]
    free = sorted(set(jobs.fleet.names) - {p["spec"]["nodeName"] for p in jobs.running(first)})
    assert explained(jobs, name).startswith(
        f"gang: pod {jobs.ns}/{name} waits for its gang, PodGroup {jobs.ns}/{second}: 0 of 4 "
        f"pods placed; the fleet has room for 2 more such pods at once ({', '.join(free)}), "
        "4 needed."
    )
    # Nothing idle held: fleet finds no gang placed in part.
    partial = [
        s for s in fleet_gather(jobs.kube, None, jobs.ns).stranded if s.reason == "partial-gang"
    ]
    assert partial == []
    jobs.remove(first)
    wait_for(lambda: len(jobs.running(second)) == PODS, f"job {second}'s 4 ranks running", 90)
    assert len(jobs.held(second)) == PODS * GPUS
    jobs.remove(second)
    jobs.nothing_left()


RACKS = ("rack-1", "rack-2")


def test_the_schedulers_gang_keeps_a_job_in_one_nvlink_domain(gang_cluster: Cluster) -> None:
    """TopologyAwareWorkloadScheduling (alpha in 1.37): six GB200 trays of four GPUs, three
    in each of two NVL72 racks (two multi-node NVLink domains: the plugin labels each Node
    gpu.dradriver.io/nvlink-domain with its fabric clique). With a tray of each rack taken,
    four trays are free, but no rack has three: a 3-rank job whose PodGroup keeps it in
    one domain waits whole rather than span the racks, and explain says so; once a rack
    has three trays free it runs whole there."""
    kube = Kube.from_kubeconfig(gang_cluster.kubeconfig)
    specs = [f"fake:4xGB200:cluster={rack},clique=1" for rack in RACKS for _ in range(3)]
    try:
        with jobs_on(gang_cluster.kubeconfig, kube, specs, gpus=4) as jobs:
            label = f"{D}/nvlink-domain"

            def domains() -> dict[str, str]:
                got = {n: (jobs.node_labels(n).get(label) or "") for n in jobs.fleet.names}
                return got if all(got.values()) else {}

            domain = wait_for(domains, "every node labelled with its NVLink domain", 30)
            racks = [
                sorted(n for n in jobs.fleet.names if domain[n] == d) for d in set(domain.values())
            ]
            assert sorted(len(r) for r in racks) == [3, 3]
            busy = {r[0]: f"outside-{i}" for i, r in enumerate(racks)}  # a tray of each rack
            for node, pod in busy.items():
                kube.create(
                    path_for("v1", "pods", jobs.ns),
                    {
                        "metadata": {"name": pod},
                        "spec": {
                            **jobs.fleet.pod_spec(),
                            "nodeSelector": {"kubernetes.io/hostname": node},
                        },
                    },
                )
            for pod in busy.values():
                wait_for(lambda pod=pod: jobs.held_by_pod(pod), f"{pod}'s tray allocated", 60)
            jobs.submit("a", group=True, ranks=3, topology=label)
            wait_for(lambda: len(jobs.unschedulable("a")) == 3, "job a's ranks waiting", 60)
            for _ in range(25):
                assert [p for p in jobs.pods("a") if p["spec"].get("nodeName")] == []
                assert jobs.held("a") == []
                time.sleep(0.2)
            name = jobs.pods("a")[0]["metadata"]["name"]
            said = explained(jobs, name)
            assert said.startswith(
                f"gang: pod {jobs.ns}/{name} waits for its gang, PodGroup {jobs.ns}/a: 0 of 3 "
                "pods placed; the fleet has room for 4 more such pods at once, but at most 2 "
                f"in one {label} ("
            ), said
            assert "), 3 needed." in said, said
            # The second rack's tray is free again: the job goes there, whole.
            kube.delete(path_for("v1", "pods", jobs.ns, name=busy[racks[1][0]]))
            wait_for(lambda: len(jobs.running("a")) == 3, "job a's 3 ranks running", 90)
            assert sorted(p["spec"]["nodeName"] for p in jobs.running("a")) == racks[1]
            jobs.remove("a")
            kube.delete(path_for("v1", "pods", jobs.ns, name=busy[racks[0][0]]))
            jobs.nothing_left()
    finally:
        kube.close()


def test_the_schedulers_gang_places_mig_ranks_whole_and_leaves_nothing_carved(
    gang_cluster: Cluster,
) -> None:
    """Ranks on MIG devices carved on demand: three H100s in dynamic MIG mode, a rank a
    4g.40gb (one fits a GPU). Two 2-rank PodGroups: one runs whole, carved on two GPUs;
    the other has nothing carved, bound or allocated (without the gang one rank would
    take the third GPU) until the first is done; then it runs whole, and once both are
    done no MIG instance is left."""
    kube = Kube.from_kubeconfig(gang_cluster.kubeconfig)
    spec = "1xH100-80GB"
    profile = 'device.attributes["gpu.dradriver.io"].profile == "4g.40gb"'
    rank = {"deviceClassName": "mig.dradriver.io", "selectors": [{"cel": {"expression": profile}}]}
    try:
        with jobs_on(
            gang_cluster.kubeconfig, kube, [f"fake:{spec}"] * 3, mig_mode="dynamic", rank=rank
        ) as jobs:

            def carved() -> dict[str, list[str]]:
                out = {}
                for n in jobs.fleet.nodes:
                    fake = load(spec, node=n.kubelet.node, state_dir=n.plugin.state_dir)
                    out[n.kubelet.node] = [
                        gi.profile.name
                        for g in fake.machine.gpus
                        for gi in g.gpu_instances.values()
                    ]
                return out

            for job in ("a", "b"):
                jobs.submit(job, group=True, ranks=2)

            def whole() -> str | None:
                return next((j for j in ("a", "b") if len(jobs.running(j)) == 2), None)

            first = wait_for(whole, "one job's 2 ranks running", 90)
            second = "b" if first == "a" else "a"
            wait_for(lambda: len(jobs.pods(second)) == 2, f"job {second}'s pods", 30)
            for _ in range(25):
                assert [p for p in jobs.pods(second) if p["spec"].get("nodeName")] == []
                assert jobs.held(second) == []
                time.sleep(0.2)
            on = {p["spec"]["nodeName"] for p in jobs.running(first)}
            assert {n: c for n, c in carved().items() if c} == {n: ["4g.40gb"] for n in on}
            jobs.remove(first)
            wait_for(lambda: len(jobs.running(second)) == 2, f"job {second}'s ranks running", 90)
            jobs.remove(second)
            jobs.nothing_left()
            wait_for(lambda: not any(carved().values()), "every MIG instance destroyed", 30)
    finally:
        kube.close()
