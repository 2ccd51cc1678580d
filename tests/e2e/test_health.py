"""A sick GPU stops being scheduled and its pods learn it (Q7), on the alpha control plane
(DRADeviceTaints: the real scheduler and kube-controller-manager's device-taint eviction)
and a hollow node (the real v1.34 kubelet with ResourceHealthStatus): faults injected
into the running plugin's fake GPUs with `dradriver dev inject`."""

from __future__ import annotations

import io
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from dradriver.cli import main
from dradriver.health.model import Fault
from dradriver.k8s import Kube, path_for
from dradriver.nvml.library import open_nvml
from dradriver.slices.build import MigMode, build
from dradriver.slices.publish import SlicePublisher
from dradriver.slices.taints import TaintEffect, with_taints
from fakenvml import load
from tests.support.gpu_names import names_of

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    allocated_health,
    ensure_device_classes,
    get_or_none,
    wait_for,
)

pytestmark = pytest.mark.e2e
D = "gpu.dradriver.io"
KEY = f"{D}/unhealthy"
GPU = 'device.attributes["gpu.dradriver.io"].type == "gpu"'


class HealthNode(NodeUnderTest):
    def inject(self, *args: str) -> str:
        out = io.StringIO()
        argv = ["dev", "inject", "--state-dir", str(self.plugin.state_dir), *args]
        with redirect_stdout(out), redirect_stderr(out):
            rc = main(argv)
        assert rc == 0, out.getvalue()
        return out.getvalue()

    def slices(self) -> list[dict[str, Any]]:
        return list(
            self.kube.list(
                path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={self.kubelet.node}"
            )["items"]
        )

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        """Device name -> its taints, as the API server holds them."""
        return {
            d["name"]: d["taints"]
            for s in self.slices()
            for d in s["spec"].get("devices") or []
            if d.get("taints")
        }

    def devices(self) -> set[str]:
        return {d["name"] for s in self.slices() for d in s["spec"].get("devices") or []}

    def generations(self) -> dict[str, int]:
        """metadata.generation per slice: +1 for every write of its spec."""
        return {s["metadata"]["name"]: int(s["metadata"]["generation"]) for s in self.slices()}

    def allocated(self, claim: str) -> list[str]:
        c = self.kube.get(path_for(RES, "resourceclaims", self.ns, name=claim))
        return [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]

    def pod(self, name: str) -> dict[str, Any] | None:
        return get_or_none(self.kube, path_for("v1", "pods", self.ns, name=name))

    def resource_health(self, name: str) -> list[str]:
        return allocated_health(self.pod(name))


Start = Callable[..., HealthNode]


@pytest.fixture
def health_node(
    alpha_cluster: Cluster, alpha_kube: Kube, hollow_node: Callable[..., HollowNode]
) -> Iterator[Start]:
    k = alpha_kube
    ensure_device_classes(k)
    started: list[tuple[PluginProc, str]] = []

    def start(spec: str, mode: str = "none", effect: str = "NoSchedule") -> HealthNode:
        """`spec`: a fake device spec, or a fleet YAML's text."""
        kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
        if "ResourceHealthStatus" in alpha_cluster.line.gates_to_turn_on():
            assert "ResourceHealthStatus=true" in kubelet.log()
        if "\n" in spec:
            fleet = kubelet.root.parent / f"{kubelet.node}-fleet.yaml"
            fleet.write_text(spec)
            spec = f"@{fleet}"
        plugin = PluginProc(
            alpha_cluster.kubeconfig,
            kubelet,
            f"fake:{spec}",
            mode,
            extra_args=[
                "--health-taint-effect",
                effect,
                "--health-probe-period",
                "1",
                "--health-recovery-probes",
                "2",
            ],
        )
        plugin.start()
        ns = f"health-{secrets.token_hex(3)}"
        k.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
        started.append((plugin, ns))
        wait_for(
            lambda: get_or_none(k, path_for("v1", "serviceaccounts", ns, name="default")),
            "the default ServiceAccount",
            30,
        )
        wait_for(plugin.ready, "the plugin", 30)
        return HealthNode(k, ns, kubelet, plugin)

    yield start
    for plugin, ns in started:
        plugin.stop()
        print(f"--- plugin log, last lines ---\n{plugin.log()[-6000:]}")
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def test_xid_79_taints_that_gpu_and_its_mig_devices_and_new_claims_avoid_it(
    health_node: Start,
) -> None:
    n = health_node("2xH100-80GB", mode="dynamic")
    wait_for(lambda: len(n.devices()) == 52, "both GPUs' 26 devices published", 30)
    before = n.generations()

    # Application XIDs (the skip list) change nothing at all: no taint, no write.
    n.inject("--gpu", "1", "--xid", "13")
    n.inject("--gpu", "1", "--xid", "43")
    time.sleep(3)  # three probe periods
    assert n.taints() == {} and n.generations() == before

    t0 = time.monotonic()
    out = n.inject("--gpu", "1", "--xid", "79")
    assert "XID 79 raised on GPU 1" in out
    g1 = n.real("gpu-1")
    gpu1 = {d for d in n.devices() if d == g1 or d.startswith(f"{g1}-")}
    assert len(gpu1) == 26
    wait_for(lambda: set(n.taints()) == gpu1, "GPU 1 and its MIG devices tainted", 5)
    print(f"XID 79 -> taints in the API server: {time.monotonic() - t0:.2f} s")
    taints = n.taints()
    assert all(len(t) == 1 for t in taints.values())
    # The event (XID 79) or the probe (off the bus) may say it first; the first is kept.
    reason = next(iter(taints.values()))[0]["value"]
    assert reason in ("xid-79", "lost")
    assert {(t[0]["key"], t[0]["value"], t[0]["effect"]) for t in taints.values()} == {
        (KEY, reason, "NoSchedule")
    }
    assert len({t[0]["timeAdded"] for t in taints.values()}) == 1
    # One slice write: the slice that holds GPU 1's devices, once.
    after = n.generations()
    changed = {s: after[s] - before[s] for s in before if after[s] != before[s]}
    (holder,) = {
        s["metadata"]["name"]
        for s in n.slices()
        for d in s["spec"].get("devices") or []
        if d["name"] in gpu1
    }
    assert changed == {holder: 1}, changed
    healthy = n.plugin.metric
    wait_for(lambda: healthy("dradriver_device_healthy", device=g1) == 0, "the metric", 5)
    assert healthy("dradriver_device_healthy", device=n.real("gpu-0")) == 1

    # New claims never get it: the whole GPU 0, then nothing left for a MIG device.
    n.claim_and_pod("whole", GPU, device_class="gpu.dradriver.io", request="gpu")
    n.running("whole")
    assert n.allocated("whole") == [n.real("gpu-0")]
    n.claim_and_pod("part", "true")
    time.sleep(5)
    assert (n.pod("part") or {}).get("status", {}).get("phase") == "Pending"
    assert not (n.pod("part") or {}).get("spec", {}).get("nodeName")
    out = io.StringIO()
    with redirect_stdout(out):
        main(["explain", "pod/part", "-n", n.ns, "--kubeconfig", n.plugin.kubeconfig])
    (verdict,) = [x for x in out.getvalue().splitlines() if x.startswith("=> ")]
    assert verdict.startswith("=> allocation: all 50 devices matching request mig are taken")
    assert f"25 tainted ({KEY}={reason}:NoSchedule, not tolerated)" in verdict

    # A reset: two clean probes later the taints are gone and GPU 1 is offered again.
    t0 = time.monotonic()
    n.inject("--gpu", "1", "--recover")
    wait_for(lambda: n.taints() == {}, "the taints removed", 15)
    print(f"reset -> taints removed: {time.monotonic() - t0:.2f} s")
    assert n.generations()[next(iter(changed))] == after[next(iter(changed))] + 1
    n.running("part")
    (part,) = n.allocated("part")
    assert part.startswith(n.real("gpu-1-mig-"))


def test_the_pod_learns_it_through_the_kubelet(alpha_cluster: Cluster, health_node: Start) -> None:
    n = health_node("2xH100-80GB")
    # Which of a pod's claims the kubelet reports the health of (UpdateAllocatedResources-
    # Status, pkg/kubelet/cm/dra/manager.go) depends on its line: 1.34 only one the pod
    # names whose name is the container's claim name (it compares them with
    # ClaimInfo.ClaimName); 1.35 only one made from a template (it looks the claim up in
    # pod.status.resourceClaimStatuses); from 1.36 both.
    if alpha_cluster.line.minor == 35:
        n.template_and_pod("job", GPU, device_class="gpu.dradriver.io", request="job")
        n.running("job")
        claim = n.claim_of("job")
    else:
        n.claim_and_pod("job", GPU, device_class="gpu.dradriver.io", request="job")
        n.running("job")
        claim = "job"
    (device,) = n.allocated(claim)
    index = str(n.gpu_names().index(device))  # its NVML index, for dev inject
    wait_for(lambda: n.resource_health("job") == ["Healthy"], "Healthy in the pod status", 30)

    t0 = time.monotonic()
    n.inject("--gpu", index, "--xid", "79")
    wait_for(lambda: n.resource_health("job") == ["Unhealthy"], "Unhealthy in the pod", 30)
    print(f"XID 79 -> pod status Unhealthy: {time.monotonic() - t0:.2f} s")
    # The taint and the health stream go separate ways (a slice write, a gRPC message):
    # either may arrive first.
    wait_for(lambda: set(n.taints()) == {device}, "the taint", 5)
    # NoSchedule: the pod keeps running.
    assert (n.pod("job") or {}).get("status", {}).get("phase") == "Running"

    def events() -> list[dict[str, Any]]:
        return list(
            n.kube.list(
                path_for("v1", "events", "default"),
                fieldSelector=f"involvedObject.name={n.kubelet.node},reason=GpuUnhealthy",
            )["items"]
        )

    (ev,) = wait_for(events, "the node's GpuUnhealthy Event", 5)
    # The XID and the probe that finds the GPU off the bus report the same fault from two
    # threads, and the first reason is kept (health/model.py): either may name it.
    reason = "xid-79" if "xid-79" in ev["message"] else "lost"
    assert f"GPU {index} (GPU-" in ev["message"] and f"unhealthy ({reason})" in ev["message"]

    n.inject("--gpu", index, "--recover")
    wait_for(lambda: n.resource_health("job") == ["Healthy"], "Healthy again in the pod", 30)
    wait_for(lambda: n.taints() == {}, "the taint removed", 5)


def test_noexecute_evicts_the_pod(health_node: Start) -> None:
    n = health_node("2xH100-80GB", effect="NoExecute")
    n.claim_and_pod("victim", GPU, device_class="gpu.dradriver.io", request="gpu")
    n.running("victim")
    (device,) = n.allocated("victim")
    uid = (n.pod("victim") or {})["metadata"]["uid"]
    t0 = time.monotonic()
    n.inject("--gpu", str(n.gpu_names().index(device)), "--xid", "79")
    wait_for(lambda: set(n.taints()) == {device}, "the taint", 5)
    assert n.taints()[device][0]["effect"] == "NoExecute"

    def evicted() -> bool:
        p = n.pod("victim")
        if p is None or p["metadata"]["uid"] != uid:
            return True
        return any(
            c.get("type") == "DisruptionTarget"
            and c.get("reason") == "DeletionByDeviceTaintManager"
            for c in p.get("status", {}).get("conditions") or []
        )

    wait_for(evicted, "kube-controller-manager to evict the pod", 60)
    print(f"XID 79 -> pod evicted: {time.monotonic() - t0:.2f} s")
    wait_for(lambda: n.pod("victim") is None, "the pod gone", 60)


def test_noexecute_evicts_a_mig_pod_of_a_gpu_off_the_bus(health_node: Start) -> None:
    """Dynamic MIG mode: the pod's partition is carved on GPU 0, which then falls off the
    bus. The pod is evicted and its claim unprepared although NVML cannot reach the GPU
    to destroy the MIG device (the reset that brings the GPU back destroys it)."""
    n = health_node("1xH100-80GB", mode="dynamic", effect="NoExecute")
    n.claim_and_pod("mig", "true")
    n.running("mig")
    (device,) = n.allocated("mig")
    assert device.startswith(n.real("gpu-0-mig-"))
    n.inject("--gpu", "0", "--lost")
    wait_for(lambda: device in n.taints(), "the partition tainted", 5)
    wait_for(lambda: n.pod("mig") is None, "the pod evicted and gone", 60)
    n.inject("--gpu", "0", "--recover")
    wait_for(lambda: n.taints() == {}, "the taints removed", 15)


def test_an_xid_naming_a_gpu_instance_taints_that_instance_only(health_node: Start) -> None:
    fleet = (
        "gpus:\n- product: H100-80GB\n  mig: on\n  migDevices:\n"
        "  - {gpu: 0, profile: 3g.40gb, placement: 0}\n"
        "  - {gpu: 0, profile: 3g.40gb, placement: 4}\n"
    )
    n = health_node(fleet, mode="static")
    wait_for(lambda: len(n.devices()) == 2, "the two MIG devices published", 30)
    fake = load(n.plugin.devices.removeprefix("fake:"), node=n.kubelet.node,
                state_dir=n.plugin.state_dir)  # fmt: skip
    gi = next(g for g in fake.machine.gpus[0].gpu_instances.values() if g.start == 4)
    # XID 69 (graphics engine class error) leaves no state behind for the probe: what it
    # taints is the event's scope alone. (48, 94 and 95 leave a row remapping pending, a
    # GPU reset away, and the probe then taints the whole GPU.)
    n.inject("--gpu", "0", "--xid", "69", "--gpu-instance", str(gi.id))
    wait_for(lambda: bool(n.taints()), "a taint", 5)
    ((name, taints),) = n.taints().items()
    assert name.startswith(n.real("gpu-0-mig-3g40gb-4")), name  # the instance at placement 4
    assert taints[0]["value"] == "xid-69"
    # Nothing the probes see: two clean ones later (--health-recovery-probes 2) it is
    # healthy again, and no other device was tainted meanwhile.
    ever: set[str] = set()

    def cleared() -> bool:
        now = n.taints()
        ever.update(now)
        return not now

    wait_for(cleared, "the instance healthy again", 10)
    assert ever == {name}


def test_a_lost_gpu_and_a_restart_keep_it_tainted(health_node: Start) -> None:
    n = health_node("2xH100-80GB")
    n.inject("--gpu", "0", "--lost")
    gpu0 = n.real("gpu-0")
    wait_for(lambda: set(n.taints()) == {gpu0}, "the lost GPU tainted", 5)
    # The event (XID 79) or the probe (off the bus) may say it first.
    assert n.taints()[gpu0][0]["value"] in ("xid-79", "lost")
    assert n.devices() == set(n.gpu_names())  # still published, from its last description
    before, taints = n.generations(), n.taints()

    n.plugin.stop()
    n.plugin.start()
    wait_for(n.plugin.ready, "the restarted plugin", 30)
    assert n.taints() == taints  # the same taint, the same timeAdded
    assert n.generations() == before  # nothing to write after the restart
    assert "GPU still unhealthy from before the restart" in n.plugin.log()

    n.inject("--gpu", "0", "--recover")
    wait_for(lambda: n.taints() == {}, "the taint removed after the reset", 15)


def test_a_claim_that_tolerates_the_taint_gets_the_unhealthy_gpu(health_node: Start) -> None:
    """examples/claims/gpu-tolerating-unhealthy.yaml: a diagnostic job on the one GPU
    left, which is tainted NoSchedule. (A tolerated NoExecute taint still evicts with the
    1.34 scheduler: kubernetes/kubernetes#134434.)"""
    n = health_node("1xH100-80GB")
    n.inject("--gpu", "0", "--xid", "48")  # a double-bit ECC error
    gpu0 = n.real("gpu-0")
    wait_for(lambda: set(n.taints()) == {gpu0}, "the taint", 5)
    assert n.taints()[gpu0][0]["value"] == "xid-48"
    # Without the toleration, a claim for the same GPU stays pending.
    n.claim_and_pod("intolerant", GPU, device_class="gpu.dradriver.io", request="gpu")
    time.sleep(3)
    assert not (n.pod("intolerant") or {}).get("spec", {}).get("nodeName")
    (pod,) = n.apply("gpu-tolerating-unhealthy")
    running = n.running(pod)
    name = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    assert n.allocated(name) == [gpu0]


def test_without_the_gate_the_taints_are_dropped_and_publishing_goes_on(
    cluster: Cluster, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """The GA control plane (DRADeviceTaints off): the API server drops the field. The
    publisher says which gate to enable, once, keeps the devices published and does not
    rewrite the slice over and over."""
    if cluster.has("DRADeviceTaints"):
        pytest.skip(f"DRADeviceTaints is on by default on {cluster.line.name}")
    node = f"nogate-{secrets.token_hex(3)}"
    pub = SlicePublisher(kube, D, node)
    inv = open_nvml("fake:2xL4", node=node, state_dir=None).discover().inventory
    built = build(inv, MigMode.NONE)
    gpus = names_of(inv)  # by NVML index
    tainted = with_taints(
        built.slices, {gpus[1]: Fault("xid-79", 1)}, D, effect=TaintEffect.NO_SCHEDULE
    )
    try:
        with caplog.at_level(logging.WARNING):
            first = pub.sync(tainted)
            again = pub.sync(tainted)
        assert first.created == 1 and again.writes == 0
        assert pub.taints_dropped
        warned = [r for r in caplog.records if "DRADeviceTaints" in r.getMessage()]
        assert len(warned) == 1
        assert "enable the DRADeviceTaints feature gate" in warned[0].getMessage()
        (stored,) = pub.existing()
        assert [d["name"] for d in stored["spec"]["devices"]] == gpus
        assert not any(d.get("taints") for d in stored["spec"]["devices"])
    finally:
        pub.delete_all()


def test_pods_with_several_gpus_or_claims_run_in_the_api(health_node: Start) -> None:
    """Q14b: with ResourceHealthStatus on (each line's DRA gates as `make demo` has them),
    the kubelet writes one allocatedResourcesStatus entry per device of a claim, named by
    the device's first CDI ID, and the API server refuses a status with a duplicate. A
    pod with a two-GPU claim, and one with two claims, must reach Running in the API (not
    only in the runtime), each device reported once, the driver's files given once."""
    n = health_node("8xH100-80GB")
    res = path_for(RES, "resourceclaims", n.ns)

    def spec(count: int) -> dict[str, Any]:
        exactly = {"deviceClassName": "gpu.dradriver.io", "count": count}
        return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}

    def pod(name: str, claims: list[dict[str, str]]) -> None:
        container = {
            "name": "main",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"claims": [{"name": c["name"]} for c in claims]},
        }
        body = {
            "nodeSelector": {"kubernetes.io/hostname": n.kubelet.node},
            "resourceClaims": claims,
            "containers": [container],
        }
        n.kube.create(path_for("v1", "pods", n.ns), {"metadata": {"name": name}, "spec": body})

    # Which claims a kubelet reports differs by line (see the test above): 1.34 those the
    # pod names by their own name ("pair", "solo"), 1.35 those made from a template
    # ("tmpl"), 1.36 on all; each line so meets a claim of two GPUs.
    n.kube.create(res, {"metadata": {"name": "pair"}, "spec": spec(2)})
    n.kube.create(res, {"metadata": {"name": "solo"}, "spec": spec(1)})
    n.kube.create(
        path_for(RES, "resourceclaimtemplates", n.ns),
        {"metadata": {"name": "duo"}, "spec": {"spec": spec(2)}},
    )

    def running(name: str) -> bool:
        """The API server holds the pod Running, its container running and ready (the
        kubelet's status patches accepted)."""
        st = (n.pod(name) or {}).get("status", {})
        cs = st.get("containerStatuses") or [{}]
        up = all("running" in c.get("state", {}) and c.get("ready") for c in cs)
        return st.get("phase") == "Running" and up

    def reported() -> dict[str, list[dict[str, str]]]:
        """Both pods' health entries by pod claim (claim:<name>)."""
        return {
            e["name"]: e["resources"]
            for pod_name in ("pair", "duo")
            for cs in (n.pod(pod_name) or {}).get("status", {}).get("containerStatuses") or []
            for e in cs.get("allocatedResourcesStatus") or []
        }

    pod("pair", [{"name": "pair", "resourceClaimName": "pair"}])
    wait_for(lambda: running("pair"), "pod pair Running in the API", 60)
    # Made once the first is placed (the scheduler may park a pod whose claims it tried
    # while another allocation was in flight: test_consumable.py).
    pod(
        "duo",
        [
            {"name": "solo", "resourceClaimName": "solo"},
            {"name": "tmpl", "resourceClaimTemplateName": "duo"},
        ],
    )
    wait_for(lambda: running("duo"), "pod duo Running in the API", 60)
    entries = wait_for(
        lambda: (
            (got := reported())
            and any(len(rs) == 2 for rs in got.values())
            and all(r["health"] == "Healthy" for rs in got.values() for r in rs)
            and got
        ),
        "a claim of two GPUs reported Healthy in a pod's status",
        30,
    )
    claims = {"claim:pair": "pair", "claim:solo": "solo", "claim:tmpl": n.claim_of("duo")}
    for entry, resources in entries.items():
        ids = [r["resourceID"] for r in resources]
        # One entry per device, each named by the device's own CDI ID.
        assert len(ids) == len(set(ids)) == len(n.allocated(claims[entry])), entries
        assert all(i.startswith(f"{D}/claim=gpu-") for i in ids), ids

    # The container of two claims got all three GPUs' devices, and the driver's files
    # (the node's driver spec, named by each GPU) once.
    rec = n.record(n.pod("duo") or {})
    assert sum(1 for i in rec["cdiDevices"] if i.startswith(f"{D}/claim=")) == 3
    assert f"{D}/driver=files" in rec["cdiDevices"]
    paths = [m["containerPath"] for m in rec["mounts"]]
    assert "/usr/bin/nvidia-smi" in paths and len(paths) == len(set(paths))
    assert sum(1 for h in rec["hooks"] if "update-ldcache" in h["args"]) == 1
