"""Extended resources served by DRA, read as the v1.34 scheduler reads them (pure)."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose import extended
from dradriver.diagnose.explain import explain
from dradriver.diagnose.explain_report import ClaimRef
from dradriver.diagnose.world import build_world

D = "gpu.dradriver.io"
GPUS = f'device.driver == "{D}" && device.attributes["{D}"].type == "gpu"'


def cls(name: str, resource: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": GPUS}}]}
    if resource:
        spec["extendedResourceName"] = resource
    return {"metadata": {"name": name}, "spec": spec}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"initContainers": list(init), "containers": list(containers)},
    }


def ctr(
    name: str, limits: dict[str, str], requests: dict[str, str] | None = None
) -> dict[str, Any]:
    res: dict[str, Any] = {"limits": limits}
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "resources": res}


def node(name: str, allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable or {"cpu": "8"}}}


def gpu_slice(node_name: str, n: int) -> dict[str, Any]:
    return {
        "spec": {
            "driver": D,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(n)
            ],
        }
    }


def test_extended_names_are_those_outside_kubernetes_io() -> None:
    assert extended.is_extended("nvidia.com/gpu")
    assert not extended.is_extended("cpu")
    assert not extended.is_extended("hugepages-2Mi")
    assert not extended.is_extended("requests.nvidia.com/gpu")
    # A class's implicit name is under kubernetes.io/: 1.34 takes it for a native one.
    assert not extended.is_extended("deviceclass.resource.kubernetes.io/gpu.dradriver.io")


def test_request_names_follow_the_scheduler() -> None:
    p = pod(
        ctr("a", {"cpu": "1", "nvidia.com/gpu": "2"}),
        ctr("b", {"example.com/fpga": "1", "nvidia.com/gpu": "1"}),
        init=(ctr("setup", {"nvidia.com/gpu": "1"}),),
    )
    got = [(a.container, a.resource, a.count, a.request) for a in extended.asked(p)]
    # i counts init containers first; j is the place among the sorted request names
    # (a limit without a request is also the request).
    assert got == [
        ("setup", "nvidia.com/gpu", 1, "container-0-request-0"),
        ("a", "nvidia.com/gpu", 2, "container-1-request-1"),
        ("b", "example.com/fpga", 1, "container-2-request-0"),
        ("b", "nvidia.com/gpu", 1, "container-2-request-1"),
    ]


def test_the_claim_the_scheduler_would_make() -> None:
    p = pod(ctr("a", {"nvidia.com/gpu": "2"}))
    plan = extended.plan(p, [cls(D), cls("extended." + D, "nvidia.com/gpu")], [node("n1")])
    assert plan.unserved is None
    assert plan.claim is not None
    assert plan.claim["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-0",
            "exactly": {
                "deviceClassName": "extended." + D,
                "allocationMode": "ExactCount",
                "count": 2,
            },
        }
    ]
    assert any("through DRA as request container-0-request-0" in n for n in plan.notes)


def test_nothing_serves_it_names_the_chart_value() -> None:
    p = pod(ctr("cuda", {"nvidia.com/gpu": "1"}))
    plan = extended.plan(p, [cls(D)], [node("n1")])
    assert plan.claim is None
    assert plan.unserved is not None
    assert plan.unserved.layer == "deviceclass"
    assert "container cuda asks for 1 nvidia.com/gpu" in plan.unserved.message
    assert "extendedResourceClass.enabled=true" in plan.unserved.fix


def test_a_device_plugin_node_serves_it_without_a_class() -> None:
    p = pod(ctr("cuda", {"nvidia.com/gpu": "1"}))
    plan = extended.plan(p, [cls(D)], [node("old", {"nvidia.com/gpu": "8"}), node("new")])
    assert plan.claim is None and plan.unserved is None
    assert "device plugin advertises on old" in plan.notes[0]


def test_two_classes_for_one_name_is_said() -> None:
    p = pod(ctr("cuda", {"nvidia.com/gpu": "1"}))
    plan = extended.plan(p, [cls("a", "nvidia.com/gpu"), cls("b", "nvidia.com/gpu")], [node("n1")])
    assert any("not always the same" in n for n in plan.notes)


def test_explain_weighs_the_made_up_claim_per_node() -> None:
    p = pod(ctr("cuda", {"nvidia.com/gpu": "5"}))
    classes = [cls(D), cls("extended." + D, "nvidia.com/gpu")]
    nodes = [node("n1"), node("n2")]
    plan = extended.plan(p, classes, nodes)
    assert plan.claim is not None
    w = build_world([gpu_slice("n1", 4), gpu_slice("n2", 2)], classes, [], nodes=nodes)
    report = explain("pod ml/train", [ClaimRef("ml/train", plan.claim)], w, pod=p)
    (req,) = report.requests
    assert (req.request, req.device_class, req.count) == (
        "container-0-request-0",
        "extended." + D,
        "5",
    )
    assert {r.node: r.free for r in req.rows} == {"n1": 4, "n2": 2}
    assert report.finding is not None
