"""A pod's gang, with plain values: what counts as a gang, how much of it is placed, where
the rest would fit at once, and what explain then says."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.explain_report import Finding, NodeRow, Report, RequestReport
from dradriver.diagnose.gang import Gang, gang, gang_size, group_name, job_name, room, with_gang


def pod(name: str, node: str = "", phase: str = "Pending", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "ownerReferences": [{"kind": "Job", "name": "a", "controller": True}],
        },
        "spec": {"nodeName": node, **spec} if node else dict(spec),
        "status": {"phase": phase},
    }


def request(count: str, **free: int) -> RequestReport:
    return RequestReport(
        "ns/c", "gpus", "gpu.dradriver.io", count,
        rows=[NodeRow(n, free=k, usable=k) for n, k in sorted(free.items())],
    )  # fmt: skip


def test_a_pod_group_with_a_gang_policy_is_a_gang_of_its_min_count() -> None:
    p = pod("a-0", schedulingGroup={"podGroupName": "a"})
    assert group_name(p) == "a" and job_name(p) == "a"
    assert gang_size(pod_group={"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}) == 4
    assert gang_size(pod_group={"spec": {"schedulingPolicy": {"basic": {}}}}) is None


def test_an_indexed_job_of_ranks_is_a_gang_and_a_job_of_workers_is_not() -> None:
    ranks = {"completionMode": "Indexed", "parallelism": 4, "completions": 4}
    assert gang_size(job={"spec": ranks}) == 4
    assert gang_size(job={"spec": {**ranks, "completionMode": "NonIndexed"}}) is None
    assert gang_size(job={"spec": {**ranks, "completions": 100}}) is None  # a work queue
    assert gang_size(job={"spec": {**ranks, "parallelism": 1, "completions": 1}}) is None


def test_a_job_in_a_kueue_queue_is_a_gang_of_what_runs_at_once() -> None:
    queued = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "training"}}}
    assert gang_size(job={**queued, "spec": {"parallelism": 4, "completions": 40}}) == 4
    assert gang_size(job={**queued, "spec": {"parallelism": 4, "completions": 2}}) == 2
    assert gang_size(job={**queued, "spec": {"parallelism": 1, "completions": 1}}) is None


def test_placed_members_are_the_live_pods_bound_to_a_node() -> None:
    pods = [
        pod("a-2"),
        pod("a-0", node="n1", phase="Running"),
        pod("a-1", node="n2", phase="Running"),
        pod("a-3", node="n3", phase="Succeeded"),  # done: no longer a member in play
    ]
    g = gang(kind="Job", name="ns/a", size=4, pods=pods)
    assert (g.members, g.placed, g.whole) == (("a-0", "a-1", "a-2"), ("a-0", "a-1"), False)


def test_room_is_how_many_more_such_pods_fit_per_node_at_once() -> None:
    reqs = [request("8", n1=16, n2=8, n3=7), request("1", n1=1, n2=3, n3=5)]
    assert room(reqs) == {"n1": 1, "n2": 1}
    refused = request("8", n1=8)
    refused.rows[0].refused = "cordoned"
    assert room([refused]) == {}
    assert room([request("all", n1=2, n2=0)]) == {"n1": 1}


def test_explain_says_the_pod_waits_for_its_gang_instead_of_the_schedulers_words() -> None:
    report = Report("pod ns/b-0", requests=[request("8", n1=8, n2=8, n3=0)])
    report.finding = Finding("scheduler", "the scheduler says: pod group is unschedulable")
    g = Gang("PodGroup", "ns/b", 4, ("b-0", "b-1", "b-2", "b-3"), ())
    with_gang(report, "ns/b-0", g)
    assert report.finding is not None
    assert report.finding.line().startswith(
        "gang: pod ns/b-0 waits for its gang, PodGroup ns/b: 0 of 4 pods placed; the fleet "
        "has room for 2 more such pods at once (n1, n2), 4 needed."
    ), report.finding.line()
    assert "placed whole, in one go, once 4 pods fit at once" in report.finding.fix


def test_a_partly_placed_job_holds_devices_and_explain_says_which_pods() -> None:
    report = Report("pod ns/a-3", requests=[request("8", n1=0)])
    report.finding = Finding("allocation", "all 48 devices matching request gpus are taken.")
    g = Gang("Job", "ns/a", 4, ("a-0", "a-1", "a-2", "a-3"), ("a-0", "a-1", "a-2"))
    with_gang(report, "ns/a-3", g)
    assert report.finding is not None
    assert report.finding.message == (
        "pod ns/a-3 waits for its gang, Job ns/a: 3 of 4 pods placed (a-0, a-1, a-2), "
        "holding their devices until the rest are; no node has room for another such pod "
        "now, 1 needed; what it lacks: all 48 devices matching request gpus are taken"
    )
    assert "Kueue with waitForPodsReady" in report.finding.fix


def test_a_pod_that_fits_nowhere_keeps_its_own_finding_and_the_gang_is_a_note() -> None:
    own = Finding("selector", "0 of 8 devices match")
    report = Report("pod ns/b-0", finding=own)
    with_gang(report, "ns/b-0", Gang("PodGroup", "ns/b", 4, ("b-0",), ()))
    assert report.finding is own
    assert report.notes and report.notes[0].startswith("pod ns/b-0 waits for its gang")


def test_a_whole_gang_changes_nothing() -> None:
    report = Report("pod ns/a-0")
    with_gang(report, "ns/a-0", Gang("PodGroup", "ns/a", 2, ("a-0", "a-1"), ("a-0", "a-1")))
    assert (report.finding, report.notes) == (None, [])


def test_a_gang_kept_in_one_domain_counts_the_room_in_its_best_domain() -> None:
    """Four nodes free across two NVLink domains, two in each: room for four at once, but
    a PodGroup that must stay in one domain fits at most two."""
    key = "gpu.dradriver.io/nvlink-domain"
    labels = {"n1": {key: "r1"}, "n2": {key: "r1"}, "n3": {key: "r2"}, "n4": {key: "r2"}}
    report = Report("pod ns/a-0", requests=[request("4", n1=4, n2=4, n3=4, n4=4)])
    g = Gang("PodGroup", "ns/a", 3, ("a-0", "a-1", "a-2"), (), topology=(key,))
    with_gang(report, "ns/a-0", g, labels=labels)
    assert report.finding is not None
    assert report.finding.message == (
        "pod ns/a-0 waits for its gang, PodGroup ns/a: 0 of 3 pods placed; the fleet has room "
        f"for 4 more such pods at once, but at most 2 in one {key} (r2: n3, n4), "
        "3 needed"
    )
    assert f"once 3 pods fit at once in one {key}; or free room for 1 more" in (report.finding.fix)
    # Room for three in one domain: the topology is no reason to wait.
    labels["n2"] = {key: "r2"}
    report = Report("pod ns/a-0", requests=[request("4", n1=4, n2=4, n3=4, n4=4)])
    with_gang(report, "ns/a-0", g, labels=labels)
    assert report.finding is not None and "at most" not in report.finding.message
