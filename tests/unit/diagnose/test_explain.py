"""explain's judgement, on slices built by the driver's own code from fake GPUs that
follow NVIDIA's geometry, and claims and nodes as the API server returns them."""

from __future__ import annotations

from typing import Any

from dradriver.diagnose.explain import explain
from dradriver.diagnose.explain_report import ClaimRef
from dradriver.diagnose.world import build_world
from dradriver.inventory.node_devices import MigMode
from tests.support.explain import CLASSES, D, claim, line, node, pod, run, slices
from tests.support.gpu_names import fake_names


def test_nothing_published_anywhere() -> None:
    r = run(claim("c"), [], [node("n1")])
    assert line(r).startswith("slices: no ResourceSlices from any DRA driver on any node")
    assert "dradriver doctor" in line(r)


def test_a_typo_in_the_device_class_is_named_with_the_nearest_name() -> None:
    r = run(claim("c", device_class="gpu.dradriver.oi"), slices("n1", "2xH100-80GB"), [node("n1")])
    assert line(r).startswith("deviceclass: request gpu names DeviceClass gpu.dradriver.oi")
    assert "did you mean gpu.dradriver.io?" in line(r) and "Fix:" in line(r)


def test_80gb_is_not_80gi_and_the_nearest_miss_says_so() -> None:
    sel = f'device.capacity["{D}"].memory.compareTo(quantity("80Gi")) >= 0'
    r = run(claim("c", sel), slices("n1", "2xH100-80GB+2xL4"), [node("n1")])
    text = line(r)
    assert text.startswith(f"selector: 0 of 4 devices of class {D} match `{sel}`")
    assert f"the largest {D}/memory is 79.6Gi (NVIDIA H100 80GB HBM3)" in text
    assert r.requests[0].rows[0].in_class == 4 and r.requests[0].rows[0].matching == 0


def test_the_failing_condition_of_several_is_the_one_named() -> None:
    sel = (
        f'device.attributes["{D}"].migCapable && '
        f'device.attributes["{D}"].productName == "NVIDIA A100-SXM4-80GB"'
    )
    r = run(claim("c", sel), slices("n1", "2xH100-80GB+2xL4"), [node("n1")])
    assert "match `device.attributes" in line(r) and 'productName == "NVIDIA A100' in line(r)
    assert f'{D}/productName has "NVIDIA H100 80GB HBM3" (2), "NVIDIA L4" (2)' in line(r)


def test_a_missing_attribute_is_the_cel_error_that_stops_the_scheduler() -> None:
    r = run(
        claim("c", f'device.attributes["{D}"].memoryGB > 40'), slices("n1", "2xL4"), [node("n1")]
    )
    text = line(r)
    assert text.startswith("selector: request gpu selector #0 fails with a CEL runtime error")
    assert "on 2 of 2 devices" in text and "memoryGB" in text and "has(" in text


def test_more_than_any_node_has() -> None:
    r = run(
        claim("c", count=3), slices("n1", "2xL4") + slices("n2", "2xL4"), [node("n1"), node("n2")]
    )
    assert line(r).startswith(
        "capacity: request gpu asks for 3 devices, and the most any node has that match is 2"
    )


def test_every_matching_device_taken_names_the_holders() -> None:
    s = slices("n1", "2xL4")
    gpus = fake_names("2xL4", "n1")  # by NVML index
    held = claim("holder", allocated=[("n1", gpus[0]), ("n1", gpus[1])])
    r = run(claim("c"), s, [node("n1")], [held])
    text = line(r)
    assert text.startswith("allocation: all 2 devices matching request gpu are taken")
    assert "default/holder (2)" in text
    row = r.requests[0].rows[0]
    assert (row.matching, row.taken, row.free) == (2, 2, 0)


def test_a_carved_partition_blocks_the_rest_of_its_gpu_by_counters() -> None:
    s = slices("n1", "1xH100-80GB", MigMode.DYNAMIC)
    whole = next(d["name"] for sl in s for d in sl["spec"]["devices"] if "7g" in d["name"])
    held = claim("holder", device_class="mig.dradriver.io", allocated=[("n1", whole)])
    r = run(claim("c", device_class="mig.dradriver.io"), s, [node("n1")], [held])
    text = line(r)
    assert text.startswith("allocation: all ")
    assert "blocked because the GPU they are carved from is used" in text
    row = r.requests[0].rows[0]
    assert row.taken == 1 and row.counters == row.matching - 1 and row.free == 0


def test_mig_class_without_partitions_when_the_gate_is_off() -> None:
    r = run(
        claim("c", device_class="mig.dradriver.io"),
        slices("n1", "2xH100-80GB"),
        [node("n1")],
        gates={"DRAPartitionableDevices": False},
    )
    assert line(r).startswith("feature-gate: no MIG devices are published")
    assert "enable DRAPartitionableDevices" in line(r)


def test_node_level_reasons() -> None:
    s = slices("n1", "1xL4")
    c = claim("c")
    cases = [
        (node("n1", unschedulable=True), {}, "n1: cordoned"),
        (
            node("n1", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]),
            {},
            "n1: taint gpu=yes:NoSchedule not tolerated",
        ),
        (node("n1"), {"nodeSelector": {"zone": "b"}}, "n1: node selector zone=b does not match"),
    ]
    for n, spec, reason in cases:
        r = run(c, s, [n], p=pod("p", "c", **spec))
        assert line(r).startswith("node: only nodes the pod may not use have the devices")
        assert reason in line(r) and "uncordon" in line(r)
    tolerated = pod("p", "c", tolerations=[{"key": "gpu", "operator": "Exists"}])
    r = run(c, s, [node("n1", taints=[{"key": "gpu", "effect": "NoSchedule"}])], p=tolerated)
    assert r.finding is None and r.requests[0].fits_on == ["n1"]


def test_a_claim_that_fits_has_no_finding() -> None:
    r = run(claim("c", count=2), slices("n1", "2xL4"), [node("n1")])
    assert r.finding is None and r.requests[0].fits_on == ["n1"]


def test_an_allocated_claim_is_reported_with_its_devices() -> None:
    c = claim("c", allocated=[("n1", "gpu-0")])
    r = run(c, slices("n1", "2xL4"), [node("n1")])
    assert r.notes == ["claim default/c is allocated on n1: n1/gpu-0"] and r.finding is None


def test_an_unhealthy_gpu_is_named_with_its_taint() -> None:
    """The driver's taint on an unhealthy GPU (DRADeviceTaints), as the API server holds
    it: the one free GPU is tainted and the request does not tolerate it."""
    s = slices("n1", "2xL4")
    taint = {"key": f"{D}/unhealthy", "value": "xid-79", "effect": "NoSchedule",
             "timeAdded": "2026-01-01T00:00:00Z"}  # fmt: skip
    gpus = fake_names("2xL4", "n1")  # by NVML index
    for d in s[0]["spec"]["devices"]:
        if d["name"] == gpus[1]:
            d["taints"] = [taint]
    held = claim("holder", allocated=[("n1", gpus[0])])
    r = run(claim("c"), s, [node("n1")], [held])
    text = line(r)
    assert text.startswith("allocation: all 2 devices matching request gpu are taken")
    assert f"1 tainted ({D}/unhealthy=xid-79:NoSchedule, not tolerated)" in text
    row = r.requests[0].rows[0]
    assert (row.matching, row.taken, row.tainted, row.free) == (2, 1, 1, 0)
    # Only the tainted one left: the health layer says so.
    r = run(claim("c"), s, [node("n1")], [])
    assert r.requests[0].rows[0].free == 1  # gpu-0 is free: nothing blocks
    alone = slices("n1", "1xL4")
    alone[0]["spec"]["devices"][0]["taints"] = [taint]
    r = run(claim("c"), alone, [node("n1")], [])
    assert line(r).startswith(
        "health: the 1 devices matching request gpu that are not allocated carry a taint "
        f"it does not tolerate: {fake_names('1xL4', 'n1')[0]} ({D}/unhealthy=xid-79:NoSchedule)"
    )
    # A request that tolerates it fits.
    tolerant = claim("c")
    tolerant["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": f"{D}/unhealthy", "operator": "Exists"}
    ]
    assert run(tolerant, alone, [node("n1")], []).finding is None


def test_a_cel_typo_names_the_nearest_published_attribute() -> None:
    """The issue's `.product`: no device publishes it, so the fix is the name the slices
    do publish, not a has() guard."""
    sel = f'device.attributes["{D}"].product == "NVIDIA L4"'
    text = line(run(claim("c", sel), slices("n1", "2xL4"), [node("n1")]))
    assert text.startswith("selector: request gpu selector #0 fails with a CEL runtime error")
    assert text.endswith(
        f"no published device has attribute {D}/product: did you mean "
        f'device.attributes["{D}"].productName? Fix: correct the name in the selector to '
        f'device.attributes["{D}"].productName'
    )
    # In a DeviceClass's selector too (the same step, on every published device).
    typo_class = {
        "metadata": {"name": "typo.example.com"},
        "spec": {"selectors": [{"cel": {"expression": f'device.attributes["{D}"].brnd == "x"'}}]},
    }
    world = build_world(slices("n1", "2xL4"), [*CLASSES, typo_class], [], nodes=[node("n1")])
    c = claim("c", device_class="typo.example.com")
    r = explain("x", [ClaimRef("default/c", c)], world)
    assert line(r).startswith("selector: DeviceClass typo.example.com selector #0 fails")
    assert f'did you mean device.attributes["{D}"].brand?' in line(r)


def test_a_name_nothing_is_close_to_lists_what_the_domain_publishes() -> None:
    sel = f'device.attributes["{D}"].memoryGB > 40'
    text = line(run(claim("c", sel), slices("n1", "1xL4"), [node("n1")]))
    assert "did you mean" not in text
    assert f"no published device has attribute {D}/memoryGB" in text
    assert "Fix: guard attributes some devices lack with has(" in text
    assert f"({D} publishes attributes architecture, brand, cudaComputeCapability," in text


def test_a_name_some_devices_lack_is_a_guard_not_a_typo() -> None:
    """migCapable is published by the H100 and not (say) by an older driver's slice: the
    L4's slice here drops it, so the fix is has(), with how many have it."""
    s = slices("n1", "1xH100-80GB") + slices("n2", "1xL4")
    for d in s[-1]["spec"]["devices"]:
        d["attributes"].pop("migCapable", None)
    sel = f'device.attributes["{D}"].migCapable'
    text = line(run(claim("c", sel), s, [node("n1"), node("n2")]))
    assert f"; 1 of 2 published devices have attribute {D}/migCapable." in text
    assert "did you mean" not in text and "Fix: guard attributes some devices lack" in text


def test_a_pod_waiting_for_its_imex_daemon_is_told_so_with_the_fix() -> None:
    c = claim("c", allocated=[("n1", "gpu-0")])
    p = pod("p", "c", nodeName="n1")
    said = (
        "NodePrepareResources failed for claim default/c: claim default/c: IMEX layer: "
        "ComputeDomain default/train: this node's IMEX daemon did not answer READY within "
        "10 s (nvidia-imex-ctl -q: UNAVAILABLE); it is stopped and the kubelet retries"
    )
    event = {"type": "Warning", "reason": "FailedPrepareDynamicResources", "message": said}
    world = build_world(slices("n1", "2xL4"), CLASSES, [c], nodes=[node("n1")], gates=None)
    r = explain("x", [ClaimRef("default/c", c)], world, pod=p, events=[event])
    assert r.finding is not None and r.finding.layer == "IMEX"
    text = r.finding.line()
    assert text.startswith("IMEX: the pod is on n1, waiting for its ComputeDomain's IMEX channel")
    assert "nvidia-imex-ctl -N" in text
    waiting = dict(
        event,
        message=said.replace(
            "this node's IMEX daemon did not", "waiting for its nodes: 1 of 2 did not"
        ),
    )
    r = explain("x", [ClaimRef("default/c", c)], world, pod=p, events=[waiting])
    assert r.finding is not None and "the job's other pods must be scheduled" in r.finding.line()


def _held(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """A claim allocated a channel with binding conditions, its node's conditions so."""
    c = claim("c", allocated=[("n1", "imex-channel")])
    (r,) = c["status"]["allocation"]["devices"]["results"]
    r.update(bindingConditions=["IMEXDaemonReady"], bindingFailureConditions=["IMEXDaemonFailed"])
    c["status"]["devices"] = [
        {"driver": D, "pool": "n1", "device": "imex-channel", "conditions": conditions}
    ]
    return c


FAILED = (
    "IMEX layer: ComputeDomain default/train: this node's IMEX daemon did not answer READY "
    "(nvidia-imex-ctl -q: UNAVAILABLE): daemon pod dradriver/imex-u-1 on node n1 is not "
    "serving (running) after 20 s: `kubectl -n dradriver logs imex-u-1` and `describe pod "
    "imex-u-1` say why; it is stopped and the scheduler places the pod again"
)


def test_a_pod_held_at_binding_is_told_what_its_node_waits_for() -> None:
    waiting = {
        "type": "IMEXDaemonReady",
        "status": "False",
        "message": "IMEX layer: ComputeDomain default/train: waiting for its nodes before "
        "starting this node's IMEX daemon: 1 of 2 nodes of the domain have joined (n1)",
    }
    c = _held([waiting])
    world = build_world(slices("n1", "2xL4"), CLASSES, [c], nodes=[node("n1")], gates=None)
    r = explain("x", [ClaimRef("default/c", c)], world, pod=pod("p", "c"), events=[])
    assert r.finding is not None and r.finding.layer == "IMEX"
    text = r.finding.line()
    assert text.startswith("IMEX: the scheduler holds the pod until the IMEX daemon on n1")
    assert "1 of 2 nodes of the domain have joined" in text
    assert "the job's other pods must be scheduled" in text and "kubelet" not in text
    # Not reported yet, after an earlier try failed: that failure and its fix.
    c = _held([])
    event = {
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": 'running PreBind plugin "DynamicResources": claim c binding failed: '
        f'reason=IMEXNotReady, message="{FAILED}"',
    }
    r = explain("x", [ClaimRef("default/c", c)], world, pod=pod("p", "c"), events=[event])
    assert r.finding is not None
    text = r.finding.line()
    assert "n1's plugin is starting it" in text and "an earlier try failed" in text
    assert "nvidia-imex-ctl -N" in text and text.count("kubectl -n dradriver logs imex-u-1") == 1
    # Failed: the node gave up; the same when the scheduler has deallocated the claim.
    c = _held([{"type": "IMEXDaemonFailed", "status": "True", "message": FAILED}])
    r = explain("x", [ClaimRef("default/c", c)], world, pod=pod("p", "c"), events=[])
    assert r.finding is not None
    assert r.finding.line().startswith("IMEX: n1 could not get the pod's IMEX daemon ready")
    free = claim("c")
    r = explain("x", [ClaimRef("default/c", free)], world, pod=pod("p", "c"), events=[event])
    assert r.finding is not None and r.finding.layer == "IMEX", r.finding
    assert "the scheduler could not bind the pod" in r.finding.line()
    # A bound pod is prepare's business, not binding's.
    assert (
        explain("x", [ClaimRef("default/c", c)], world, pod=pod("p", "c", nodeName="n1")).finding
        is None
    )
