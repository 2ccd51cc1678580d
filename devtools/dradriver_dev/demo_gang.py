"""The demo's all-or-nothing job: examples/gang/kueue-training-job.yaml through the real
Kueue (built from its Go module, cached) on the two fake GB200 trays, a rank a tray's four
GPUs: a ClusterQueue of the trays' eight GPUs admits one 2-rank job, which runs whole; a
second waits whole, with no pod and no GPU, and runs whole once the first is done."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dradriver.k8s import Kube, path_for
from dradriver_dev import kueue

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "gang" / "kueue-training-job.yaml"
RES = "resource.k8s.io/v1"
RANKS, GPUS_PER_RANK = 2, 4
PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "Job": "jobs",
}


def _documents(trays: list[str]) -> list[dict[str, Any]]:
    """The example, sized for the trays: a quota of their GPUs, a rank a tray."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for d in docs:
        if d["kind"] == "ClusterQueue":
            d["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = (
                RANKS * GPUS_PER_RANK
            )
        elif d["kind"] == "ResourceClaimTemplate":
            d["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = GPUS_PER_RANK
        elif d["kind"] == "Job":
            d["spec"].update(parallelism=RANKS, completions=RANKS)
            pod = d["spec"]["template"]["spec"]
            pod["terminationGracePeriodSeconds"] = 1
            pod["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": trays,
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
    return docs


def _job(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (job,) = [dict(d, metadata={**d["metadata"], "name": name}) for d in docs if d["kind"] == "Job"]
    return job


def _ranks(kube: Kube, ns: str, job: str) -> list[dict[str, Any]]:
    pods = kube.list(path_for("v1", "pods", ns), labelSelector=f"job-name={job}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _running(kube: Kube, ns: str, job: str) -> list[str]:
    return sorted(
        p["spec"]["nodeName"]
        for p in _ranks(kube, ns, job)
        if p["status"].get("phase") == "Running"
    )


def _quota_reserved(kube: Kube, ns: str, job: str) -> str:
    w = kueue.workload(kube, ns, job)
    for status in ("True", "False"):
        if (c := kueue.condition(w, "QuotaReserved", status)) is not None:
            return f"QuotaReserved={status}: {c.get('message', '')}"
    return "no Workload yet"


def _until(what: str, fn: Callable[[], object], timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.3)


def show(kube: Kube, kubeconfig: str, *, ns: str, trays: list[str], say: Any) -> None:
    """Runs the demo's two jobs on the trays (the pods already there go first), printing
    what each holds."""
    on_trays = [
        p["metadata"]["name"]
        for p in kube.list(path_for("v1", "pods", ns))["items"]
        if p["spec"].get("nodeName") in trays
    ]
    for name in on_trays:
        kube.delete(path_for("v1", "pods", ns, name=name), missing_ok=True)
    _until(
        "the trays' pods gone",
        lambda: (
            not any(
                p["spec"].get("nodeName") in trays
                for p in kube.list(path_for("v1", "pods", ns))["items"]
            )
        ),
        60,
    )
    say(
        "all or nothing: building (or finding) Kueue v0.17 and starting it with "
        "waitForPodsReady; two 2-rank jobs from examples/gang/kueue-training-job.yaml (a rank "
        f"a GB200 tray's 4 GPUs) in a ClusterQueue of the trays' {RANKS * GPUS_PER_RANK} GPUs"
    )
    work = Path(kubeconfig).parent / "kueue"
    k = kueue.start(
        kubeconfig,
        {"gpu.dradriver.io": ["gpu.dradriver.io"]},
        work=work,
        pods_ready={"timeout": "2m", "blockAdmission": True},
    )
    try:
        docs = _documents(trays)
        for d in docs:
            if d["kind"] != "Job":
                namespaced = d["kind"] not in ("ResourceFlavor", "ClusterQueue")
                kube.create(
                    path_for(d["apiVersion"], PLURALS[d["kind"]], ns if namespaced else None), d
                )
        # One after the other: submitted together, either may be admitted first.
        kube.create(path_for("batch/v1", "jobs", ns), _job(docs, "train-a"))
        _until("train-a admitted", lambda: "True" in _quota_reserved(kube, ns, "train-a"), 60)
        kube.create(path_for("batch/v1", "jobs", ns), _job(docs, "train-b"))
        try:
            _until("train-a running whole", lambda: len(_running(kube, ns, "train-a")) == RANKS)
        except TimeoutError:
            say(f"train-a: {_quota_reserved(kube, ns, 'train-a')}; Kueue's log:\n{k.log()[-3000:]}")
            raise
        _until(
            "train-b held back by its quota",
            lambda: "quota" in _quota_reserved(kube, ns, "train-b"),
            30,
        )
        on = ", ".join(_running(kube, ns, "train-a"))
        print(f"\n  job train-a: {RANKS} of {RANKS} ranks running, on {on}")
        print(
            f"  job train-b: {len(_ranks(kube, ns, 'train-b'))} pods, no GPU held; "
            f"{_quota_reserved(kube, ns, 'train-b')}"
        )
        say("train-a is done (deleted): train-b is admitted and placed whole")
        kube.request(
            "DELETE",
            path_for("batch/v1", "jobs", ns, name="train-a"),
            body={"propagationPolicy": "Background"},
        )
        _until("train-b running whole", lambda: len(_running(kube, ns, "train-b")) == RANKS)
        on = ", ".join(_running(kube, ns, "train-b"))
        print(f"  job train-b: {RANKS} of {RANKS} ranks running, on {on}\n")
        # train-b keeps running, its two trays held, until the demo ends (or KEEP=1).
    finally:
        k.stop()
