"""Fair sharing with the real Kueue (Q13 item 4): Kueue v0.17's manager, built from its Go
module (tools/kueue/build.sh), runs against the real control plane with its DRA support on,
charging our chart's quota class for H100s as a resource of that name: the class and the
mapping are what `dradriver fleet --quota-classes --kueue` says for the fleet. Two
teams' ClusterQueues share a cohort, two H100s each, on a hollow node whose four fake
H100s the plugin publishes and prepares. Team A's jobs are admitted within its quota,
then borrow team B's idle GPUs; when team B submits, Kueue reclaims them (A's borrowing
job is preempted, its pods go, its GPUs are unprepared) and B's job runs on them; when B
is done, A borrows them again. Every admitted pod runs on a GPU of its own."""

from __future__ import annotations

import contextlib
import io
import secrets
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.diagnose.fleet_quota import class_name
from dradriver.k8s import Kube, KubeError, path_for
from dradriver_dev import kueue

from .helpers import (
    REPO,
    RES,
    Cluster,
    HollowNode,
    PluginProc,
    apply_object,
    ensure_device_classes,
    new_namespace,
    run_helm,
    wait_for,
)

pytestmark = pytest.mark.e2e

H100 = "NVIDIA H100 80GB HBM3"
# What `dradriver fleet --quota-classes` names the H100s' class, and the chart makes.
CLASS = f"{class_name(H100)}.gpu.dradriver.io"
COHORT = "gpus"
SELECTOR = "device.capacity['gpu.dradriver.io'].memory.compareTo(quantity('40Gi')) >= 0"
K = kueue.API


def fleet_says(kubeconfig: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`dradriver fleet --quota-classes --kueue`: the chart's quotaClasses values for what
    the fleet publishes, and Kueue's mapping of those classes."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["fleet", "--kubeconfig", kubeconfig, "--quota-classes", "--kueue"]) == 0
    values, kueue_cfg = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    return values["quotaClasses"], kueue_cfg


def quota_class(helm: Any, product: dict[str, str]) -> dict[str, Any]:
    """The chart's DeviceClass for one product (quotaClasses.products), as a platform team
    installs it for Kueue to count."""
    out = run_helm(
        helm,
        "template",
        "dradriver",
        str(REPO / "deploy" / "helm" / "dradriver"),
        "--kube-version",
        "v1.34.4",
        values={"quotaClasses": {"products": [product]}},
    )
    (cls,) = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "DeviceClass" and d["metadata"]["name"] == CLASS
    ]
    return dict(cls)


def cluster_queue(name: str, gpus: int, flavor: str, resource: str = CLASS) -> dict[str, Any]:
    """What a platform team writes: a nominal quota of H100s in a shared cohort, the rest
    of the cohort's idle ones borrowable, and its own taken back when it needs them."""
    return {
        "apiVersion": K,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
            "resourceGroups": [
                {
                    "coveredResources": [resource],
                    "flavors": [
                        {"name": flavor, "resources": [{"name": resource, "nominalQuota": gpus}]}
                    ],
                }
            ],
        },
    }


@dataclass
class Teams:
    kube: Kube
    node: str
    suffix: str
    resource: str = CLASS  # what the ClusterQueues' quotas count
    namespaces: dict[str, str] = field(default_factory=dict)  # team -> namespace

    def job(
        self, team: str, name: str, pods: int, template: str = "h100", limits: bool = False
    ) -> None:
        """A Job of `pods` pods, one GPU each, submitted to the team's queue: through the
        claim template `template`, or (`limits`) as the device plugin's users ask,
        `nvidia.com/gpu: 1` in the container's limits. Created suspended, as Kueue's Job
        webhook (not installed here) would make it."""
        ns = self.namespaces[team]
        container: dict[str, Any] = {"name": "train", "image": "registry.k8s.io/pause:3.10"}
        claims: list[dict[str, Any]] = []
        if limits:
            # Requests too: Kueue 0.17 looks for a DRA-served extended resource in the
            # template's requests only, and a Job's template gets no requests defaulted
            # from its limits (a Pod does); with limits alone it is charged as
            # nvidia.com/gpu, which no ClusterQueue here has.
            container["resources"] = {
                "limits": {"nvidia.com/gpu": "1"},
                "requests": {"nvidia.com/gpu": "1"},
            }
        else:
            container["resources"] = {"claims": [{"name": "gpu"}]}
            claims = [{"name": "gpu", "resourceClaimTemplateName": template}]
        self.kube.create(
            path_for("batch/v1", "jobs", ns),
            {
                "metadata": {"name": name, "labels": {kueue.QUEUE_LABEL: team}},
                "spec": {
                    "suspend": True,
                    "parallelism": pods,
                    "completions": pods,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "terminationGracePeriodSeconds": 1,
                            "nodeSelector": {"kubernetes.io/hostname": self.node},
                            "resourceClaims": claims,
                            "containers": [container],
                        }
                    },
                },
            },
        )

    def workload(self, team: str, job: str) -> dict[str, Any] | None:
        return kueue.workload(self.kube, self.namespaces[team], job) or None

    def condition(self, team: str, job: str, kind: str) -> dict[str, Any] | None:
        return kueue.condition(self.workload(team, job) or {}, kind)

    def admitted(self, team: str, job: str) -> bool:
        return self.condition(team, job, "Admitted") is not None

    def running_pods(self, team: str, job: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods_of(team, job)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def pods_of(self, team: str, job: str) -> list[dict[str, Any]]:
        ns = self.namespaces[team]
        return list(
            self.kube.list(path_for("v1", "pods", ns), labelSelector=f"job-name={job}")["items"]
        )

    def gpus(self, team: str, job: str) -> list[str]:
        """The devices the job's running pods' claims hold."""
        ns = self.namespaces[team]
        out = []
        for p in self.running_pods(team, job):
            names = [s["resourceClaimName"] for s in p["status"].get("resourceClaimStatuses") or []]
            extended = p["status"].get("extendedResourceClaimStatus")  # nvidia.com/gpu
            names += [extended["resourceClaimName"]] if extended else []
            for name in names:
                c = self.kube.get(path_for(RES, "resourceclaims", ns, name=name))
                out += [
                    f"{r['pool']}/{r['device']}"
                    for r in c["status"]["allocation"]["devices"]["results"]
                ]
        return out

    def usage(self, queue: str) -> tuple[int, int]:
        """(GPUs the ClusterQueue's admitted workloads hold, of them borrowed)."""
        cq = self.kube.get(path_for(K, "clusterqueues", name=queue))
        for f in (cq.get("status") or {}).get("flavorsUsage") or []:
            for r in f.get("resources") or []:
                if r["name"] == self.resource:
                    return int(r.get("total", 0)), int(r.get("borrowed", 0))
        return 0, 0

    def used(self, queue: str, total: int, borrowed: int) -> None:
        """Until the ClusterQueue's status (Kueue writes it a moment after admitting)
        says it holds `total` GPUs, `borrowed` of them from the cohort."""
        wait_for(lambda: self.usage(queue) == (total, borrowed), f"{queue} holding {total}", 30)

    def runs(self, team: str, job: str, pods: int, timeout: float = 90) -> list[str]:
        try:
            wait_for(lambda: self.admitted(team, job), f"{team}/{job} admitted", timeout)
        except AssertionError as exc:
            w = self.workload(team, job) or {}
            raise AssertionError(f"{exc}; its Workload's status: {w.get('status')}") from None
        wait_for(
            lambda: len(self.running_pods(team, job)) == pods,
            f"{pods} pods of {team}/{job} running",
            timeout,
        )
        return self.gpus(team, job)


@contextlib.contextmanager
def team_queues(
    kubeconfig: str,
    kube: Kube,
    hollow_node: Callable[..., HollowNode],
    *,
    classes: Callable[[], list[dict[str, Any]]],
    mappings: Callable[[], dict[str, list[str]]],
    resource: str,
    template_class: str,
    gates: dict[str, bool] | None = None,
) -> Iterator[Teams]:
    """A hollow node with four fake H100s and the plugin; `classes()` applied (once the
    plugin publishes); Kueue with `mappings()`; a flavor, and per team a namespace, a
    LocalQueue, a ClusterQueue of 2 `resource` in one cohort and a claim template `h100`
    of `template_class`. Everything goes afterwards."""
    ensure_device_classes(kube)
    kubelet = hollow_node(kubeconfig=kubeconfig, api=kube)
    plugin = PluginProc(kubeconfig, kubelet, "fake:4xH100-80GB")
    plugin.start()
    suffix = secrets.token_hex(3)
    t = Teams(kube, kubelet.node, suffix, resource)
    made: list[str] = []
    k = None
    try:
        wait_for(plugin.ready, "the plugin", 30)
        for cls in classes():
            apply_object(kube, cls)
            made.append(path_for(RES, "deviceclasses", name=cls["metadata"]["name"]))
        k = kueue.start(kubeconfig, mappings(), work=kubelet.root.parent / "kueue", gates=gates)
        # Names of this test's own: a flavor an earlier test deleted may still be going
        # (Kueue holds it with a finalizer until no queue uses it).
        flavor = f"h100-{suffix}"
        made.append(path_for(K, "resourceflavors", name=flavor))
        apply_object(
            kube, {"apiVersion": K, "kind": "ResourceFlavor", "metadata": {"name": flavor}}
        )
        for team in ("team-a", "team-b"):
            queue = f"{team}-{suffix}"
            made.append(path_for(K, "clusterqueues", name=queue))
            kube.create(path_for(K, "clusterqueues"), cluster_queue(queue, 2, flavor, resource))
            ns = new_namespace(kube, f"{team}-{suffix}")
            made.append(path_for("v1", "namespaces", name=ns))
            kube.create(
                path_for(K, "localqueues", ns),
                {
                    "apiVersion": K,
                    "kind": "LocalQueue",
                    "metadata": {"name": team},
                    "spec": {"clusterQueue": queue},
                },
            )
            kube.create(
                path_for(RES, "resourceclaimtemplates", ns),
                {
                    "metadata": {"name": "h100"},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {"name": "gpu", "exactly": {"deviceClassName": template_class}}
                                ]
                            }
                        }
                    },
                },
            )
            t.namespaces[team] = ns
        yield t
    finally:
        for ns in t.namespaces.values():
            for j in kube.list(path_for("batch/v1", "jobs", ns))["items"]:
                # Background, not Foreground: a pod held in foreground deletion waits for
                # its extended-resource claim, which 1.34's resourceclaim controller never
                # releases for a pod that still exists (kubernetes/kubernetes#134311).
                kube.request(
                    "DELETE",
                    path_for("batch/v1", "jobs", ns, name=j["metadata"]["name"]),
                    body={"propagationPolicy": "Background"},
                )
        for ns in t.namespaces.values():
            wait_for(
                lambda ns=ns: not kube.list(path_for("v1", "pods", ns))["items"],
                f"the pods of {ns} gone",
                60,
            )
        for p in reversed(made):
            with contextlib.suppress(KubeError):
                kube.delete(p, missing_ok=True)
        if k is not None:
            k.stop()
        plugin.stop()


@pytest.fixture
def teams(
    cluster: Cluster, kube: Kube, helm: Any, hollow_node: Callable[..., HollowNode]
) -> Iterator[Teams]:
    """Quota on the H100s' class, as `dradriver fleet --quota-classes --kueue` says."""
    said: dict[str, Any] = {}

    def classes() -> list[dict[str, Any]]:
        wait_for(lambda: fleet_says(cluster.kubeconfig)[0]["products"], "the fleet's H100s", 30)
        # The platform team's steps: the fleet's classes into the chart, their mapping
        # into Kueue's configuration (other tests' nodes may publish other products).
        values, said["kueue"] = fleet_says(cluster.kubeconfig)
        (h100,) = [p for p in values["products"] if p["productName"] == H100]
        return [quota_class(helm, h100)]

    def mappings() -> dict[str, list[str]]:
        found = {
            m["name"]: m["deviceClassNames"]
            for m in said["kueue"]["resources"]["deviceClassMappings"]
            if m["name"] == CLASS
        }
        assert found == {CLASS: [CLASS]}
        return found

    with team_queues(
        cluster.kubeconfig,
        kube,
        hollow_node,
        classes=classes,
        mappings=mappings,
        resource=CLASS,
        template_class=CLASS,
    ) as t:
        yield t


GPUS = "gpus"  # one quota for GPUs however they are asked for


@pytest.fixture
def mixed_teams(
    alpha_cluster: Cluster, alpha_kube: Kube, helm: Any, hollow_node: Callable[..., HollowNode]
) -> Iterator[Teams]:
    """On the alpha control plane (DRAExtendedResource): the chart's extended-resource class
    and the whole-GPU class both charged as `gpus`, with Kueue's DRAExtendedResources gate."""
    from .test_extended_resource import extended_class

    ext = extended_class(helm)
    with team_queues(
        alpha_cluster.kubeconfig,
        alpha_kube,
        hollow_node,
        classes=lambda: [ext],
        mappings=lambda: {GPUS: ["gpu.dradriver.io", ext["metadata"]["name"]]},
        resource=GPUS,
        template_class="gpu.dradriver.io",
        gates={"DRAExtendedResources": True},
    ) as t:
        yield t


def test_two_teams_share_gpus_and_borrowed_ones_are_given_back(teams: Teams) -> None:
    t = teams
    qa, qb = f"team-a-{t.suffix}", f"team-b-{t.suffix}"
    # Within quota: two H100s, Kueue charges the claim template's class.
    t.job("team-a", "a1", 2)
    a1 = t.runs("team-a", "a1", 2)
    assert len(set(a1)) == 2
    w = t.workload("team-a", "a1")
    assert w is not None
    (ps,) = w["status"]["admission"]["podSetAssignments"]
    assert ps["resourceUsage"][CLASS] == "2"
    t.used(qa, 2, 0)

    # Team B is idle: A borrows its two.
    t.job("team-a", "a2", 2)
    a2 = t.runs("team-a", "a2", 2)
    assert len(set(a1 + a2)) == 4
    t.used(qa, 4, 2)

    # Team B wants its own: Kueue reclaims them from A's borrowing and B runs on them.
    t.job("team-b", "b1", 2)
    preempted = wait_for(
        lambda: [j for j in ("a1", "a2") if t.condition("team-a", j, "Preempted")],
        "one of team A's jobs preempted",
        60,
    )
    assert len(preempted) == 1, preempted
    why = t.condition("team-a", preempted[0], "Preempted")
    assert why is not None and why["reason"] == "InCohortReclamation", why
    kept = "a2" if preempted[0] == "a1" else "a1"
    b1 = t.runs("team-b", "b1", 2)
    assert not t.running_pods("team-a", preempted[0])
    assert len(t.running_pods("team-a", kept)) == 2
    held = t.gpus("team-a", kept) + b1
    assert len(held) == len(set(held)) == 4, held
    t.used(qa, 2, 0)
    t.used(qb, 2, 0)
    # The preempted job waits, suspended, for quota.
    assert not t.admitted("team-a", preempted[0])
    job = t.kube.get(path_for("batch/v1", "jobs", t.namespaces["team-a"], name=preempted[0]))
    assert job["spec"]["suspend"] is True

    # B is done: its GPUs go back to the cohort, and A's waiting job borrows them again.
    t.kube.request(
        "DELETE",
        path_for("batch/v1", "jobs", t.namespaces["team-b"], name="b1"),
        body={"propagationPolicy": "Foreground"},
    )
    again = t.runs("team-a", preempted[0], 2, timeout=120)
    held = t.gpus("team-a", kept) + again
    assert len(held) == len(set(held)) == 4, held
    t.used(qa, 4, 2)


def test_a_claim_kueue_cannot_count_is_held_with_the_reason(teams: Teams) -> None:
    """Kueue 0.17 counts only ExactCount requests of a mapped class without selectors: a
    template with a CEL selector leaves the job unadmitted, with Kueue's reason."""
    t = teams
    ns = t.namespaces["team-a"]
    t.kube.create(
        path_for(RES, "resourceclaimtemplates", ns),
        {
            "metadata": {"name": "picky"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": CLASS,
                                    "selectors": [{"cel": {"expression": SELECTOR}}],
                                },
                            }
                        ]
                    }
                }
            },
        },
    )
    t.job("team-a", "picky", 1, template="picky")

    def held() -> dict[str, Any] | None:
        w = t.workload("team-a", "picky") or {}
        for c in (w.get("status") or {}).get("conditions") or []:
            if c["type"] == "QuotaReserved" and c["status"] == "False":
                return dict(c)
        return None

    why = wait_for(held, "the job held by Kueue", 60)
    assert why["reason"] == "Inadmissible", why
    assert "CEL selectors are not supported" in why["message"], why
    assert not t.pods_of("team-a", "picky")
    # A class per product says what the selector said, and is counted.
    t.job("team-a", "plain", 1)
    assert len(t.runs("team-a", "plain", 1)) == 1


def test_pods_asking_nvidia_com_gpu_and_claims_count_against_one_quota(
    mixed_teams: Teams,
) -> None:
    """A platform team moving off the device plugin quotas both forms as one resource:
    a job whose pods ask `nvidia.com/gpu: 1` (served by the extended-resource class) and
    one whose pods use a claim template are charged to the same `gpus` quota; the second
    borrows, because the first holds the team's two."""
    t = mixed_teams
    qa = f"team-a-{t.suffix}"
    t.job("team-a", "legacy", 2, limits=True)
    legacy = t.runs("team-a", "legacy", 2)
    w = t.workload("team-a", "legacy")
    assert w is not None
    (ps,) = w["status"]["admission"]["podSetAssignments"]
    assert ps["resourceUsage"] == {GPUS: "2"}, ps
    t.used(qa, 2, 0)
    t.job("team-a", "modern", 1)
    modern = t.runs("team-a", "modern", 1)
    t.used(qa, 3, 1)
    held = legacy + modern
    assert len(held) == len(set(held)) == 3, held
