"""An upgrade as clusters go through one: the control plane first, from the oldest line to
the newest, under a node whose kubelet and plugin keep running. The plugin notices the new
API server (its slice watch breaks when the server restarts), lays its slices out for it
(1.37 refuses a slice with devices and counter sets, and its allocator offers no device of
one), a claim prepared before the upgrade stays prepared, and new claims of dynamic MIG
partitions are allocated and prepared by the new control plane."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, path_for
from dradriver.k8s.lines import NEWEST, OLDEST
from dradriver_dev import cluster as devcluster

from .helpers import (
    RES,
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    new_namespace,
    wait_for,
)

ONE_G = 'device.attributes["gpu.dradriver.io"].profile == "1g.10gb"'


def layout(kube: Kube, node: str) -> set[str]:
    """ "joint" for a slice with devices and counter sets (1.34), "counters" and "devices"
    for slices of one or the other (1.35 and later)."""
    out = set()
    for s in kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={node}")[
        "items"
    ]:
        counters, devices = bool(s["spec"].get("sharedCounters")), bool(s["spec"].get("devices"))
        out.add("joint" if counters and devices else "counters" if counters else "devices")
    return out


@pytest.fixture
def old_cluster(cluster: Cluster) -> Iterator[tuple[Path, devcluster.ClusterState]]:
    if cluster.line != NEWEST or cluster.bin_dir is None:
        pytest.skip(f"runs once, in the {NEWEST.name} line's pass, on a cluster of its own")
    state_dir = Path(tempfile.mkdtemp(prefix="dradriver-upgrade-"))
    st = devcluster.up(state_dir, alpha=True, k8s=OLDEST)
    try:
        yield state_dir, st
    finally:
        devcluster.down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_the_control_plane_is_upgraded_under_a_running_node(
    old_cluster: tuple[Path, devcluster.ClusterState], short_tmp: Path
) -> None:
    state_dir, st = old_cluster
    kube = Kube.from_kubeconfig(st.kubeconfig)
    node = f"up-{secrets.token_hex(3)}"
    kubelet = HollowNode(
        st.kubeconfig, node, short_tmp / node, extra_args=["--kubernetes", OLDEST.name]
    )
    plugin = PluginProc(st.kubeconfig, kubelet, "fake:2xH100-80GB", "dynamic")
    try:
        kubelet.start()
        kubelet.wait_node_ready(kube)
        plugin.start()
        wait_for(plugin.ready, "the plugin to be ready", 30)
        n = NodeUnderTest(kube, new_namespace(kube, f"up-{secrets.token_hex(3)}"), kubelet, plugin)
        assert layout(kube, node) == {"joint"}
        n.claim_and_pod("before", ONE_G)
        before: dict[str, Any] = n.running("before")

        devcluster.upgrade(state_dir, NEWEST)
        assert kube.get("/version")["gitVersion"] == NEWEST.release
        wait_for(
            lambda: layout(kube, node) == {"counters", "devices"},
            "the plugin's slices laid out for the new line",
            60,
        )
        # The claim prepared before the upgrade is still prepared, its pod still running.
        assert len(n.checkpoint_claims()) == 1
        assert (n.running("before"))["metadata"]["uid"] == before["metadata"]["uid"]
        # A new partition, allocated by the new scheduler beside the one held.
        n.claim_and_pod("after", ONE_G)
        after = n.running("after")
        assert n.record(after)["cdiDevices"]
        claims = {
            name: kube.get(path_for(RES, "resourceclaims", n.ns, name=name))["status"]["allocation"]
            for name in ("before", "after")
        }
        devices = {c["devices"]["results"][0]["device"] for c in claims.values()}
        assert len(devices) == 2  # two partitions, not one handed out twice
        n.delete("before", "after")
        wait_for(lambda: not n.checkpoint_claims(), "both claims unprepared", 30)
    finally:
        plugin.stop()
        kubelet.stop()
        print(f"--- plugin log ---\n{plugin.log()[-4000:]}")
        kube.close()
