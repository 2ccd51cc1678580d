"""The publisher keeps a node's slices equal to the desired set with the fewest writes
and correct pool bookkeeping, and never publishes before discovery succeeded (P2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from dradriver.inventory.naming import uuid_digits
from dradriver.k8s import Kube, path_for
from dradriver.nvml.library import open_nvml
from dradriver.nvml.mig import MigCarver
from dradriver.slices.build import MigMode, build
from dradriver.slices.publish import SlicePublisher
from dradriver.slices.publish_loop import PublishLoop
from fakenvml import load
from tests.support.gpu_names import fake_names, real

from .helpers import RES, Cluster, HollowNode, wait_for

DRIVER = "gpu.dradriver.io"


def slices(kube: Kube, node: str) -> list[dict]:  # type: ignore[type-arg]
    return list(
        kube.list(path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={node}")["items"]
    )


def test_fewest_writes_and_generation(
    alpha_cluster: Cluster, alpha_kube: Kube, hollow_node: Callable[..., HollowNode], tmp_path: Path
) -> None:
    k = alpha_kube
    ln = alpha_cluster.line
    kubelet = hollow_node(kubeconfig=alpha_cluster.kubeconfig, api=k)
    pub = SlicePublisher(k, DRIVER, kubelet.node)
    # 1.34: two slices, four GPUs and their counter sets in each; from 1.35: the eight
    # counter sets in one slice, the 208 devices in four.
    spec = "8xH100-80GB"

    def desired() -> list:  # type: ignore[type-arg]
        inv = open_nvml(f"fake:{spec}", node=kubelet.node, state_dir=tmp_path).discover().inventory
        return build(inv, MigMode.DYNAMIC, line=ln).slices

    def pools() -> list[dict]:  # type: ignore[type-arg]
        return [s["spec"]["pool"] for s in slices(k, kubelet.node)]

    first = pub.sync(desired())
    made = 5 if ln.counters_apart else 2
    assert (first.created, first.updated, first.deleted, first.generation) == (made, 0, 0, 1)
    again = pub.sync(desired())
    assert again.writes == 0  # nothing changed: no write at all

    # An admin carves a MIG device on GPU 2.
    fake = load(spec, node=kubelet.node, state_dir=tmp_path)
    fake.pynvml.nvmlInit()
    carver = MigCarver(fake.pynvml)
    gpu2 = fake.machine.gpus[2].uuid
    carver.set_mig_mode(gpu2, True)
    carver.create(gpu2, 9, 0, size=4, compute_slices=3)
    one = pub.sync(desired())
    stored = {s["metadata"]["name"]: s for s in slices(k, kubelet.node)}
    gpus = fake_names(spec, kubelet.node)  # by NVML index
    names = {d["name"] for s in stored.values() for d in s["spec"].get("devices") or []}
    assert gpus[2] not in names and real("gpu-2-mig-3g40gb-4", gpus) in names
    assert real("gpu-2-mig-1g10gb-1", gpus) not in names  # overlaps the admin's device
    if not ln.counters_apart:
        # Only the slice of GPUs 0-3 (named after GPU 0's UUID) changes, in one atomic
        # update, so the generation stays.
        assert (one.created, one.updated, one.deleted, one.generation) == (0, 1, 0, 1)
        gpus_0 = f"-gpus-{uuid_digits(fake.machine.gpus[0].uuid)[:8]}"
        gpu2_slice = next(s for n, s in stored.items() if n.endswith(gpus_0))
        assert real("gpu-2-mig-3g40gb-4", gpus) in {
            d["name"] for d in gpu2_slice["spec"]["devices"]
        }
    else:
        # GPU 2's counter set (in the counters' slice), its whole device (in the first
        # slice) and its partitions change: more than one slice, so the whole pool moves
        # to a new generation and consumers never mix two views.
        assert (one.created, one.deleted, one.updated, one.generation) == (0, 0, made, 2)
        assert (
            pools() == [{"name": kubelet.node, "generation": 2, "resourceSliceCount": made}] * made
        )

    # GPUs appear: slices are added, the count changes, every slice moves to a new
    # generation so consumers never mix the two views.
    gen = one.generation + 1
    spec, tmp_path = "12xH100-80GB", tmp_path / "other-machine"
    more = pub.sync(desired())
    count = len(desired())
    assert (more.created, more.updated, more.generation) == (count - made, made, gen)
    assert (
        pools() == [{"name": kubelet.node, "generation": gen, "resourceSliceCount": count}] * count
    )
    # GPUs disappear: their slices go first, then those left are rewritten (their new
    # count); a single one left is rewritten in one atomic update, so the generation stays.
    spec, tmp_path = "4xH100-80GB", tmp_path / "third-machine"
    left = len(desired())
    fewer = pub.sync(desired())
    gen = gen if left == 1 else gen + 1
    assert (fewer.deleted, fewer.updated, fewer.generation) == (count - left, left, gen)
    assert pools() == [{"name": kubelet.node, "generation": gen, "resourceSliceCount": left}] * left


def test_nothing_is_published_before_discovery_succeeds(
    cluster: Cluster, kube: Kube, hollow_node: Callable[..., HollowNode]
) -> None:
    kubelet = hollow_node()
    pub = SlicePublisher(kube, DRIVER, kubelet.node)
    attempts: list[float] = []
    ready = threading.Event()

    def desired() -> list:  # type: ignore[type-arg]
        attempts.append(time.monotonic())
        if not ready.is_set():
            raise RuntimeError("NVML init failed: driver layer: the kernel driver is not loaded")
        inv = open_nvml("fake:2xL4", node=kubelet.node, state_dir=None).discover().inventory
        return build(inv, MigMode.NONE).slices

    loop = PublishLoop(pub, desired, period=60, backoff_max=0.5)
    stop = threading.Event()
    t = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(lambda: len(attempts) >= 3, "a few retries", 10)
        assert slices(kube, kubelet.node) == []  # never an empty or half-built pool
        assert "kernel driver is not loaded" in loop.last_error
        ready.set()
        wait_for(loop.published.is_set, "the first publication", 10)
        assert len(slices(kube, kubelet.node)) == 1
    finally:
        stop.set()
        t.join(5)


def test_api_server_unavailable_is_retried(cluster: Cluster, tmp_path: Path) -> None:
    import re

    dead = tmp_path / "kubeconfig"
    dead.write_text(
        re.sub(
            r"server: \S+",
            "server: https://127.0.0.1:1",  # nothing listens
            Path(cluster.kubeconfig).read_text(),
        )
    )
    unreachable = Kube.from_kubeconfig(str(dead))
    pub = SlicePublisher(unreachable, DRIVER, "nowhere")
    pub.start_prefetch()  # as the plugin starts: its failure is the first round's
    inv = open_nvml("fake:1xL4", node="nowhere", state_dir=None).discover().inventory
    loop = PublishLoop(pub, lambda: build(inv, MigMode.NONE).slices, backoff_max=0.2)
    stop = threading.Event()
    t = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(
            lambda: "Unreachable" in loop.last_error or "refused" in loop.last_error,
            "the publisher to report the unreachable API server",
            10,
        )
        assert not loop.published.is_set()
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()  # it kept running (retrying) until told to stop


def test_partitions_without_their_counters_are_never_visible(
    cluster: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """With DRAPartitionableDevices off (the GA cluster), the API server would store the
    partitions and drop their shared counters. A dry-run create finds that out first: the
    sync fails naming the gate, and no slice of the node ever exists, not even briefly."""
    import pytest

    from dradriver.slices.publish import PublishError

    if cluster.has("DRAPartitionableDevices"):
        pytest.skip(f"DRAPartitionableDevices is on by default on {cluster.line.name}")

    node = f"gate-off-{int(time.time() * 1000) % 10**8}"
    listing = kube.list(path_for(RES, "resourceslices"))
    rv = listing["metadata"]["resourceVersion"]
    seen: list[str] = []

    def watch() -> None:
        for ev in kube.watch(
            path_for(RES, "resourceslices"),
            resource_version=rv,
            timeout_seconds=4,
            fieldSelector=f"spec.nodeName={node}",
        ):
            if ev.get("type") != "BOOKMARK":  # the API server's progress notes, no slice
                seen.append(str(ev.get("type")))

    t = threading.Thread(target=watch)
    t.start()
    inv = open_nvml("fake:1xH100-80GB", node=node, state_dir=tmp_path).discover().inventory
    pub = SlicePublisher(kube, DRIVER, node)
    with pytest.raises(PublishError, match="DRAPartitionableDevices"):
        pub.sync(build(inv, MigMode.DYNAMIC, line=cluster.line).slices)
    t.join(10)
    assert seen == [] and slices(kube, node) == []


def test_a_stale_prefetch_costs_a_replan_and_a_republish_no_discovery(
    cluster: Cluster, kube: Kube, hollow_node: Callable[..., HollowNode]
) -> None:
    """The startup's prefetched list (taken while discovery runs) is used once: gone
    stale, as when another writer published meanwhile, it costs a conflict and a fresh
    look, never a failed publish. A republish (the kubelet's registration, which wipes
    the node's slices) writes the last content again without discovering."""
    kubelet = hollow_node()
    inv = open_nvml("fake:2xL4", node=kubelet.node, state_dir=None).discover().inventory
    content = build(inv, MigMode.NONE).slices
    pub = SlicePublisher(kube, DRIVER, kubelet.node)
    pub.start_prefetch()
    assert pub._prefetched is not None and pub._prefetched.result(10) == []  # none yet
    other = SlicePublisher(kube, DRIVER, kubelet.node)
    assert other.sync(content).created == 1  # meanwhile: the prefetched list is stale
    stats = pub.sync(content)
    assert (stats.created, stats.updated, stats.deleted) == (0, 0, 0)
    assert len(slices(kube, kubelet.node)) == 1

    discoveries: list[float] = []

    def desired() -> list:  # type: ignore[type-arg]
        discoveries.append(time.monotonic())
        return content

    loop = PublishLoop(pub, desired, period=60, first=content)
    stop = threading.Event()
    t = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    t.start()
    try:
        wait_for(loop.published.is_set, "the first round", 10)
        kube.delete_collection(
            path_for(RES, "resourceslices"), fieldSelector=f"spec.nodeName={kubelet.node}"
        )
        loop.republish()
        # The round counts once its sync returned, which may be after the slice shows.
        back = lambda: loop.rounds == 2 and len(slices(kube, kubelet.node)) == 1  # noqa: E731
        wait_for(back, "the slices back", 10)
        assert discoveries == []
        loop.trigger()
        wait_for(lambda: loop.rounds == 3, "a round with a discovery", 10)
        assert len(discoveries) == 1
    finally:
        stop.set()
        t.join(5)
