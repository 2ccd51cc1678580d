"""Dynamic MIG end to end (P4): the real scheduler allocates partitions by the shared
counters, the plugin carves them at prepare and destroys them at unprepare; MIG devices
exist exactly while their claims are prepared, and a plugin killed mid-carve leaves none
behind once restarted."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dradriver.k8s import Kube, path_for
from fakenvml import load
from tests.support.gpu_names import indexed

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    ensure_device_classes,
    get_or_none,
    wait_for,
)

# Three GPUs: a 1g, a 3g and a whole GPU always fit, wherever the scheduler puts them.
SPEC = "3xH100-80GB"


class MigNode(NodeUnderTest):
    spec = SPEC

    def layout(self) -> set[tuple[int, str, int]]:
        """What the (fake) hardware has now: (GPU index, profile, placement)."""
        fake = load(self.spec, node=self.kubelet.node, state_dir=self.plugin.state_dir)
        return {
            (g.index, gi.profile.name, gi.start)
            for g in fake.machine.gpus
            for gi in g.gpu_instances.values()
        }

    def mig_modes(self) -> list[bool]:
        fake = load(self.spec, node=self.kubelet.node, state_dir=self.plugin.state_dir)
        return [g.mig_enabled for g in fake.machine.gpus]

    def allocated(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = self.kube.get(path_for(RES, "resourceclaims", self.ns, name=name))
        return list(claim["status"]["allocation"]["devices"]["results"])


@pytest.fixture
def mig_node(
    alpha_cluster: Cluster,
    alpha_kube: Kube,
    hollow_node: Callable[..., HollowNode],
    request: pytest.FixtureRequest,
) -> Iterator[MigNode]:
    k = alpha_kube
    ensure_device_classes(k)
    kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
    # On the alpha control plane the kubelet gets the alpha gates too, unasked (none to
    # get from 1.36: on by default there).
    if "ResourceHealthStatus" in alpha_cluster.line.gates_to_turn_on():
        assert "ResourceHealthStatus=true" in kubelet.log()
    spec = getattr(request, "param", SPEC)
    plugin = PluginProc(alpha_cluster.kubeconfig, kubelet, f"fake:{spec}", "dynamic")
    plugin.start()
    ns = f"mig-{kubelet.node}"
    k.create(path_for("v1", "namespaces"), {"metadata": {"name": ns}})
    wait_for(
        lambda: get_or_none(k, path_for("v1", "serviceaccounts", ns, name="default")),
        "the default ServiceAccount",
        30,
    )
    try:
        wait_for(plugin.ready, "the plugin", 30)
        node = MigNode(k, ns, kubelet, plugin)
        node.spec = spec
        yield node
    finally:
        plugin.stop()
        k.delete(path_for("v1", "namespaces", name=ns), missing_ok=True)


def test_mig_devices_exist_exactly_while_their_claims_are_prepared(mig_node: MigNode) -> None:
    n = mig_node
    assert n.layout() == set() and n.mig_modes() == [False, False, False]
    pods = [*n.apply("mig-1g10gb"), *n.apply("mig-3g40gb"), *n.apply("gpu-by-product")]
    running = {p: n.running(p) for p in pods}
    layout = n.layout()
    names = n.gpu_names()
    assert all(
        r["device"].split("-mig-")[0] in names for p in pods for r in n.allocated(running[p])
    )
    # Exactly the allocated partitions exist, where the scheduler placed them.
    expected = set()
    for p in pods[:2]:
        (r,) = n.allocated(running[p])
        # By NVML index, as the layout reads the fake's GPUs (the name follows the UUID).
        m = re.fullmatch(r"gpu-(\d+)-mig-(\d)g(\d+)gb-(\d)", indexed(r["device"], names))
        assert m, r["device"]
        expected.add((int(m[1]), f"{m[2]}g.{m[3]}gb", int(m[4])))
    assert layout == expected
    for p in pods[:2]:
        assert n.env(running[p])["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    (whole,) = n.allocated(running[pods[2]])
    whole_gpu = names.index(whole["device"])
    assert whole_gpu not in {g for g, _, _ in layout}  # never beside a partition
    assert n.env(running[pods[2]])["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    for p in pods:
        n.delete(p)
    wait_for(lambda: n.layout() == set(), "every MIG device to be destroyed", 15)
    assert n.mig_modes() == [False, False, False]  # switched back off: we had switched it on


def test_two_3g_slices_land_on_placements_0_and_4(mig_node: MigNode) -> None:
    n = mig_node
    # Four 3g claims: wherever they land, the counters allow only placements 0 and 4.
    pods = [p for i in range(4) for p in n.apply("mig-3g40gb", f"-{i}")]
    for p in pods:
        n.running(p)
    layout = n.layout()
    assert len(layout) == 4 and {prof for _, prof, _ in layout} == {"3g.40gb"}
    assert {start for _, _, start in layout} <= {0, 4}
    for p in pods:
        n.delete(p)
    wait_for(lambda: n.layout() == set(), "every MIG device to be destroyed", 15)


@pytest.mark.parametrize("point", ["mig-created", "cdi-written"])
def test_plugin_killed_mid_carve_leaves_no_stray_instance(
    mig_node: MigNode, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = mig_node
    n.plugin.stop()
    monkeypatch.setenv("DRADRIVER_CRASHPOINT", point)
    n.plugin.start()  # this instance SIGKILLs itself at the crash point
    monkeypatch.delenv("DRADRIVER_CRASHPOINT")
    wait_for(n.plugin.ready, "the plugin", 30)
    (pod,) = n.apply("mig-1g10gb")
    wait_for(lambda: not n.plugin.alive(), f"the plugin to die at {point}", 30)
    assert n.plugin.proc is not None and n.plugin.proc.returncode == -9
    assert len(n.layout()) == 1  # the half-done carve is still on the hardware
    assert "DRADRIVER_CRASHPOINT" not in os.environ
    n.plugin.start()
    running = n.running(pod, timeout=90)  # the kubelet's retry succeeds after restart
    assert len(n.allocated(running)) == 1
    assert len(n.layout()) == 1  # the stray was destroyed, the retry carved one
    assert n.env(running)["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert "undoing an interrupted prepare" in n.plugin.log()
    n.delete(pod)
    wait_for(lambda: n.layout() == set(), "the MIG device to be destroyed", 15)


@pytest.mark.parametrize("mig_node", ["1xH100-80GB"], indirect=True)
def test_a_3g_then_a_4g_claim_both_fit_on_one_gpu(mig_node: MigNode) -> None:
    """The scheduler gives each claim the first partition that fits, walking a GPU's
    devices in the order they are published: that order is the packing policy. A 3g
    claim, then a 4g one: with placements in ascending order the 3g takes 0 and the 4g
    (which can only start at 0) finds no room. Published 3g-from-the-top, the 3g takes
    4 and the 4g fits at 0: both claims, the best possible."""
    n = mig_node
    pods = []
    for i, profile in enumerate(["3g.40gb", "4g.40gb"]):
        name = f"c{i}"
        n.claim_and_pod(name, _profile_is(profile))
        # One at a time, as a stream arrives: each allocated before the next is created.
        wait_for(
            lambda name=name: (
                n.kube.get(path_for(RES, "resourceclaims", n.ns, name=name))
                .get("status", {})
                .get("allocation")
            ),
            f"claim {name} allocated (so far: {sorted(n.layout())})",
            30,
        )
        pods.append(name)
    for p in pods:
        n.running(p, timeout=90)
    assert n.layout() == {(0, "3g.40gb", 4), (0, "4g.40gb", 0)}
    for p in pods:
        n.delete(p)
    wait_for(lambda: n.layout() == set(), "every MIG device to be destroyed", 30)


def _profile_is(profile: str) -> str:
    return f'device.attributes["gpu.dradriver.io"].profile == "{profile}"'


def _unschedulable(n: MigNode, pod: str) -> bool:
    got = n.kube.get(path_for("v1", "pods", n.ns, name=pod))
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in got.get("status", {}).get("conditions", [])
    )


@pytest.mark.parametrize("mig_node", ["1xRTX-PRO-6000"], indirect=True)
def test_the_scheduler_never_puts_an_engine_beside_me_all(mig_node: MigNode) -> None:
    """RTX PRO 6000: `1g.24gb+me.all` takes all four NVDEC/NVENC/JPEG and the OFA, so NVML
    refuses a plain 1g (one of each) beside it but takes a `-me` one. The real scheduler,
    reading only the published counters, does exactly that: the plain 1g waits, the -me
    1g runs, and the plain one runs as soon as the +me.all claim is gone."""
    n = mig_node
    n.claim_and_pod("all", _profile_is("1g.24gb+me.all"))
    n.running("all", timeout=90)
    n.claim_and_pod("plain", _profile_is("1g.24gb"))
    n.claim_and_pod("pure", _profile_is("1g.24gb-me"))
    n.running("pure", timeout=90)
    wait_for(lambda: _unschedulable(n, "plain"), "the plain 1g to be unschedulable", 30)
    assert sorted(p for _, p, _ in n.layout()) == ["1g.24gb+me.all", "1g.24gb-me"]
    n.delete("all")
    n.kube.delete(path_for(RES, "resourceclaims", n.ns, name="all"), missing_ok=True)
    n.running("plain", timeout=90)
    assert {p for _, p, _ in n.layout()} == {"1g.24gb", "1g.24gb-me"}
    for p in ("plain", "pure"):
        n.delete(p)
    wait_for(lambda: n.layout() == set(), "every MIG device to be destroyed", 30)
