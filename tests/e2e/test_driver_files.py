"""The driver's files in a container through CDI (--driver-files cdi, the plugin's
default), through the kubelet's own code: the hollow node's runtime (the CDI reference
library, as containerd resolves a claim's devices) gives a claim's container the
libraries, commands, GSP firmware and hooks NVIDIA's container toolkit found under the
node's driver root (a fake one, laid out as NVIDIA's installer lays one out). A driver
upgraded under the running plugin reaches the next container without a restart, and a
restart keeps it; with --driver-files runtime the container gets only its device nodes
and NVIDIA_VISIBLE_DEVICES, for NVIDIA's legacy runtime to add the rest (device nodes are the
fake host's: none here, and tested in kind)."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dradriver.k8s import Kube
from dradriver_dev import driver_files
from fakenvml import inject
from fakenvml.driver_root import lay_out
from fakenvml.machine import DEFAULT_DRIVER_VERSION

from .helpers import (
    Cluster,
    HollowNode,
    NodeUnderTest,
    PluginProc,
    new_namespace,
    wait_for,
)

OLD, NEW = DEFAULT_DRIVER_VERSION, "580.95.05"
LIB = "/usr/lib/x86_64-linux-gnu"
ANY_GPU = "true"
DRIVER = "gpu.dradriver.io"


def mounts(n: NodeUnderTest, pod: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in n.record(pod)["mounts"]}


def node(
    cluster: Cluster, kube: Kube, start: Callable[..., HollowNode], *args: str
) -> NodeUnderTest:
    kubelet = start()
    plugin = PluginProc(cluster.kubeconfig, kubelet, "fake:1xL4", extra_args=list(args))
    plugin.start()
    wait_for(plugin.ready, "the plugin to be ready", 30)
    return NodeUnderTest(kube, new_namespace(kube, f"df-{secrets.token_hex(3)}"), kubelet, plugin)


def test_a_container_gets_the_drivers_files_and_an_upgraded_driver_next(
    cluster: Cluster, kube: Kube, hollow_node: Callable[..., HollowNode], short_tmp: Path
) -> None:
    root = lay_out(short_tmp / "driver-root", OLD)
    n = node(cluster, kube, hollow_node, "--driver-root", str(root))
    try:
        n.claim_and_pod("before", ANY_GPU, "gpu.dradriver.io", "gpu")
        before = n.running("before")
        got = mounts(n, before)
        for path in (
            f"{LIB}/libcuda.so.{OLD}",
            f"{LIB}/libnvidia-ml.so.{OLD}",
            "/usr/bin/nvidia-smi",
        ):
            assert got[path] == f"{root}{path}", path  # the host's file, at the driver's path
        assert f"/lib/firmware/nvidia/{OLD}/gsp_ga10x.bin" in got
        hooks = [h["args"] for h in n.record(before)["hooks"]]
        assert any("update-ldcache" in a for a in hooks), hooks
        assert any("create-symlinks" in a and f"libcuda.so.1::{LIB}/libcuda.so" in a for a in hooks)
        # The hook is the plugin's own, installed beside its sockets for the runtime to run.
        hook = n.kubelet.root / "plugins" / DRIVER / "nvidia-cdi-hook"
        assert {h["path"] for h in n.record(before)["hooks"]} == {str(hook)} and hook.exists()
        env = n.env(before)
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")  # never the toolkit's void
        assert env["DRADRIVER_DRIVER_VERSION"] == OLD

        # The driver upgraded under the running plugin: its files beside the old ones
        # until they are removed, NVML reporting the new version, a rediscovery (SIGHUP
        # here; the plugin also rediscovers on its own every --rediscover-period).
        lay_out(root, NEW)
        inject.send(
            n.plugin.state_dir, n.kubelet.node, inject.Request(0, "driver", driver_version=NEW)
        )
        assert n.plugin.proc is not None
        n.plugin.proc.send_signal(signal.SIGHUP)
        spec = n.kubelet.cdi_dir / f"{DRIVER}-driver.json"
        wait_for(
            lambda: NEW in spec.read_text(), "the driver spec rewritten for the new driver", 30
        )
        n.delete("before")
        n.claim_and_pod("after", ANY_GPU, "gpu.dradriver.io", "gpu")
        got = mounts(n, n.running("after"))
        assert got[f"{LIB}/libcuda.so.{NEW}"] == f"{root}{LIB}/libcuda.so.{NEW}"
        assert not any(OLD in p for p in got)  # nothing of the driver that is gone

        # A restart (and a reboot, which wipes /var/run/cdi) keeps the driver NVML reports.
        n.plugin.stop()
        spec.unlink()
        n.plugin.start()
        wait_for(n.plugin.ready, "the plugin to be ready again", 30)
        wait_for(spec.exists, "the driver spec written at start", 30)
        assert (
            f"libcuda.so.{NEW}" in spec.read_text() and f"libcuda.so.{OLD}" not in spec.read_text()
        )
        n.delete("after")
    finally:
        n.plugin.stop()
        print(f"--- plugin log ---\n{n.plugin.log()[-4000:]}")


def test_runtime_mode_leaves_the_driver_to_nvidias_runtime(
    cluster: Cluster, kube: Kube, hollow_node: Callable[..., HollowNode]
) -> None:
    n = node(cluster, kube, hollow_node, "--driver-files", "runtime")
    try:
        n.claim_and_pod("legacy", ANY_GPU, "gpu.dradriver.io", "gpu")
        pod = n.running("legacy")
        rec = n.record(pod)
        assert rec["cdiDevices"] and not any("/driver=" in d for d in rec["cdiDevices"])
        assert not any("libcuda" in m["containerPath"] for m in rec["mounts"])
        assert n.env(pod)["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        assert not (n.kubelet.cdi_dir / f"{DRIVER}-driver.json").exists()
        n.delete("legacy")
    finally:
        n.plugin.stop()
        print(f"--- plugin log ---\n{n.plugin.log()[-4000:]}")


def test_the_fake_driver_root_is_the_fake_gpus_version() -> None:
    """What every other test's plugin runs with (dradriver_dev.driver_files.plugin_env)."""
    root = driver_files.fake_driver_root()
    assert (root / LIB.lstrip("/") / f"libcuda.so.{OLD}").is_file()
    assert (driver_files.tools_dir() / "dradriver-nvcdi").is_file()
