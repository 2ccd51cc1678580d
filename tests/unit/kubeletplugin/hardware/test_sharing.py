"""Sharing applied at prepare and undone at unprepare, over the fake NVML library and the
stand-in MPS daemon: exactly applied, exactly undone, nothing left after a failure."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import DriverError
from dradriver.kubeletplugin.daemons.spec import DaemonRef
from dradriver.kubeletplugin.hardware.sharing import LOG_SIZE, MPS_SHM_SIZE, PIPE_SIZE
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.records import Mps
from tests.support.node import DRIVER, lose_checkpoint
from tests.support.sharing_node import Node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.local.stop_all()  # never leave a daemon behind, even when a test fails


def test_no_config_means_exclusive_and_untouched(node: Node) -> None:
    node.prepare(node.claim("c", "gpu-0", None))
    assert node.sharing.recorded() == {} and node.daemons() == []
    assert node.mode(0) == node.fake.pynvml.NVML_COMPUTEMODE_DEFAULT


def test_time_slicing_is_applied_and_undone(node: Node) -> None:
    ref = node.claim(
        "c", "gpu-1", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    )
    node.prepare(ref)
    uuid = node.fake.machine.gpus[1].uuid
    assert node.sharing.recorded() == {uuid: {"timeslice": 3}}
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert node.sharing.recorded() == {uuid: {"timeslice": 0}}


def test_mps_daemon_compute_mode_and_limits(node: Node) -> None:
    nv = node.fake.pynvml
    ref = node.claim(
        "c",
        "gpu-0",
        {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 25,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
            },
        },
    )
    (d,) = node.prepare(ref)
    (pod,) = node.daemons()
    assert pod == f"mps-{ref.uid}-0"
    pid = node.local.pid(pod)
    assert node.mode(0) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    env = node.spec_env(ref)
    assert isinstance(d.sharing, Mps) and d.sharing.daemon is not None
    assert d.sharing.daemon.name == pod and node.local.serving(d.sharing.daemon)
    pipe = d.sharing.pipe_dir
    # Server and clients exchange memory in /dev/shm: the clients get the daemon's.
    shm = d.sharing.shm_dir
    assert shm is not None and (Path(shm) / "cuda.shm.mps-server").read_text().strip() == str(pid)
    spec = json.loads((node.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text())
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert {"hostPath": shm, "containerPath": "/dev/shm", "options": ["rw", "bind"]} in mounts
    # The daemon's log directory read-only: the daemon writes there as root, so a client
    # that could plant a link there would have it write elsewhere.
    logs = d.sharing.log_dir
    assert {"hostPath": logs, "containerPath": logs, "options": ["ro", "bind"]} in mounts
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={d.uuid}=10240M" in env
    # The claim's own /dev/shm, made (as a tmpfs on a real node) with mode 1777 whatever
    # the umask: a container's non-root user must be able to write it.
    assert stat.S_IMODE(os.stat(shm).st_mode) == 0o1777
    assert (Path(shm).parent / "shm-size").read_text() == str(MPS_SHM_SIZE)
    # The pipe and log directories too are memory of a bounded size (tmpfs on a real
    # node), never the disk that holds the checkpoint, with explicit modes.
    base = Path(pipe).parent
    assert (base / "pipe-size").read_text() == str(PIPE_SIZE)
    assert (base / "log-size").read_text() == str(LOG_SIZE)
    assert (
        stat.S_IMODE(os.stat(pipe).st_mode) == stat.S_IMODE(os.stat(base / "log").st_mode) == 0o755
    )
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert node.daemons() == [] and not node.local.serving(d.sharing.daemon)
    assert node.mode(0) == nv.NVML_COMPUTEMODE_DEFAULT
    assert not Path(pipe).exists() and not Path(shm).exists()


def test_each_mps_claim_has_its_own_shm(node: Node) -> None:
    """Never one /dev/shm for two claims: what one pod leaves there another would read."""
    mps = {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}
    (a,) = node.prepare(node.claim("a", "gpu-0", mps))
    (b,) = node.prepare(node.claim("b", "gpu-1", mps))
    assert isinstance(a.sharing, Mps) and isinstance(b.sharing, Mps)
    assert a.sharing.shm_dir and b.sharing.shm_dir and a.sharing.shm_dir != b.sharing.shm_dir


def test_a_failed_prepare_leaves_no_daemon_and_no_compute_mode(node: Node) -> None:
    nv = node.fake.pynvml
    ref = node.claim("c", "gpu-1", {"strategy": "MPS"})
    node.fake.faults.fail_nth("nvmlDeviceSetComputeMode", 1, nv.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(DriverError, match="compute mode"):
        node.prepare(ref)
    assert node.daemons() == [] and node.mode(1) == nv.NVML_COMPUTEMODE_DEFAULT
    assert node.driver.store.load().claims == {}

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    original = node.driver.executor.cdi_writer.write
    node.driver.executor.cdi_writer.write = full  # type: ignore[method-assign]
    with pytest.raises(DriverError, match="No space left"):
        node.prepare(ref)  # the daemon was running by then: it must be gone again
    node.driver.executor.cdi_writer.write = original  # type: ignore[method-assign]
    assert node.daemons() == [] and node.mode(1) == nv.NVML_COMPUTEMODE_DEFAULT


def test_daemon_survives_a_plugin_restart_and_runs_again_when_it_died(node: Node) -> None:
    ref = node.claim("c", "gpu-0", {"strategy": "MPS"})
    node.prepare(ref)
    (pod,) = node.daemons()
    pid = node.local.pid(pod)
    restarted = Node(node.tmp)
    restarted.claims = node.claims
    restarted.driver.reconcile()
    assert restarted.daemons() == [pod] and node.local.pid(pod) == pid  # untouched
    node.local.kill(pod)  # an OOM kill: its pod stays, the kubelet runs it again
    restarted.driver.reconcile()
    assert restarted.daemons() == [pod] and node.local.pid(pod) != pid
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}
    assert restarted.daemons() == []


def test_configs_that_do_not_fit(node: Node) -> None:
    with pytest.raises(DriverError, match="GpuConfig does not fit a mig device"):
        node.prepare(node.claim("a", "gpu-0-mig-1g10gb-0", {"strategy": "MPS"}))
    with pytest.raises(DriverError, match="time-slice interval applies to whole GPUs"):
        node.prepare(
            node.claim(
                "b",
                "gpu-0-mig-1g10gb-0",
                {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
                kind="MigDeviceConfig",
            )
        )
    assert node.fake.machine.gpus[0].gpu_instances == {}  # nothing carved for them


def test_mps_on_a_mig_device(node: Node) -> None:
    ref = node.claim("c", "gpu-1-mig-3g40gb-4", {"strategy": "MPS"}, kind="MigDeviceConfig")
    (d,) = node.prepare(ref)
    assert d.uuid.startswith("MIG-") and len(node.daemons()) == 1
    assert node.mode(1) == node.fake.pynvml.NVML_COMPUTEMODE_DEFAULT  # the GPU is shared out
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert node.daemons() == [] and node.fake.machine.gpus[1].gpu_instances == {}


def test_one_bad_claim_fails_alone(node: Node) -> None:
    """Any exception in one claim (here: a read that raises what no layer expects, and
    parameters nested thousands deep) is that claim's error; the good MPS claim of the
    same call is prepared and reported prepared."""
    good = node.claim("good", "gpu-0", {"strategy": "MPS"})
    boom = node.claim("boom", "gpu-1", None)
    deep = node.claim("deep", "gpu-1", {"strategy": "MPS", "mpsConfig": {}})
    nested: dict[str, Any] = {}
    cur = nested
    for _ in range(3000):
        cur["a"] = {}
        cur = cur["a"]
    params = node.claims["deep"]["status"]["allocation"]["devices"]["config"][0]["opaque"]
    params["parameters"]["sharing"]["mpsConfig"]["x"] = nested
    read = node.driver.read_claim
    assert read is not None

    def flaky(ref: ClaimRef) -> dict[str, Any]:
        if ref.name == "boom":
            raise KeyError("something nobody foresaw")
        return read(ref)

    node.driver.read_claim = flaky
    out = node.driver.prepare([boom, good, deep])
    assert out[good.uid].error == "" and out[good.uid].devices
    assert "internal error (KeyError" in out[boom.uid].error
    assert "nested more than 64 levels deep" in out[deep.uid].error
    assert len(out[deep.uid].error) < 600
    assert set(node.driver.store.load().claims) == {good.uid}
    node.driver.read_claim = read
    node.driver.unprepare([good])


def test_a_restart_with_the_daemon_gone_keeps_the_mode_from_before(node: Node) -> None:
    """The admin's compute mode (PROHIBITED here) comes back at unprepare, even when the
    daemon died and a restart set the claim up again: the ledger's "before" is written
    once, never overwritten by the driver's own EXCLUSIVE_PROCESS."""
    nv = node.fake.pynvml
    h = nv.nvmlDeviceGetHandleByIndex(0)
    nv.nvmlDeviceSetComputeMode(h, nv.NVML_COMPUTEMODE_PROHIBITED)
    ref = node.claim("c", "gpu-0", {"strategy": "MPS"})
    node.prepare(ref)
    (pod,) = node.daemons()
    assert node.mode(0) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    node.local.stop(DaemonRef(pod))  # its pod deleted by hand
    restarted = Node(node.tmp)
    restarted.claims = node.claims
    restarted.driver.reconcile()
    assert restarted.daemons() == [pod]  # made again
    pid = node.local.pid(pod)
    restarted.driver.reconcile()  # a second restart: the running daemon is kept
    assert restarted.daemons() == [pod] and node.local.pid(pod) == pid
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}
    assert restarted.mode(0) == nv.NVML_COMPUTEMODE_PROHIBITED
    assert restarted.daemons() == []


def test_a_lost_checkpoint_loses_no_sharing_change(node: Node) -> None:
    """The checkpoint moved aside as corrupt: the claims' pods may still run, so startup
    keeps their daemon, compute mode, interval and CDI specs; the ledger still knows them,
    and the kubelet's unprepare of each claim undoes them all."""
    nv = node.fake.pynvml
    mps_ref = node.claim("m", "gpu-0", {"strategy": "MPS"})
    ts_ref = node.claim(
        "t", "gpu-1", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    )
    node.prepare(mps_ref)
    node.prepare(ts_ref)
    (pod,) = node.daemons()
    lose_checkpoint(node.tmp)
    restarted = Node(node.tmp)
    restarted.driver.reconcile()
    uuid1 = node.fake.machine.gpus[1].uuid
    assert restarted.daemons() == [pod]
    assert restarted.mode(0) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert restarted.sharing.recorded()[uuid1] == {"timeslice": 3}
    assert len(list((node.tmp / "cdi").glob("*.json"))) == 2  # live pods' specs stay
    assert restarted.driver.unprepare([mps_ref, ts_ref]) == {mps_ref.uid: "", ts_ref.uid: ""}
    assert restarted.daemons() == []
    assert restarted.mode(0) == nv.NVML_COMPUTEMODE_DEFAULT
    assert restarted.sharing.recorded()[uuid1] == {"timeslice": 0}
    assert not list((node.tmp / "cdi").glob("*.json"))
    ledger = json.loads((node.tmp / "ledger.json").read_text())
    assert ledger["computeMode"] == {} and ledger["timeSlice"] == {}
    assert "mpsDaemons" not in ledger  # the daemons are pods: the API is their record


def test_a_daemon_started_but_not_recorded_is_still_stopped(node: Node) -> None:
    """A daemon whose pod a crash kept out of the record (made, not yet saved) is found
    by the name its directory gives when its claim is unprepared."""
    ref = node.claim("c", "gpu-0", {"strategy": "MPS"})
    node.prepare(ref)
    (pod,) = node.daemons()
    cp = node.driver.store.load()
    rec = cp.claims[ref.uid]
    for i, d in enumerate(rec.devices):
        assert isinstance(d.sharing, Mps)
        rec = rec.with_device(i, replace(d, sharing=replace(d.sharing, daemon=None)))
    cp.claims[ref.uid] = rec
    node.driver.store.save(cp)
    restarted = Node(node.tmp)
    restarted.driver.reconcile()
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}
    assert restarted.daemons() == [] and not node.local.serving(DaemonRef(pod))


def test_a_lost_checkpoint_of_a_plain_claim_still_has_its_spec_removed(node: Node) -> None:
    """No ledger knows a claim without sharing: its unprepare, after the checkpoint was
    lost, finds nothing to undo on the GPUs and removes only the CDI spec the runtime
    would otherwise keep offering."""
    ref = node.claim("plain", "gpu-0", None)
    node.prepare(ref)
    lose_checkpoint(node.tmp)
    restarted = Node(node.tmp)
    restarted.driver.reconcile()
    assert len(list((node.tmp / "cdi").glob("*.json"))) == 1  # its pod may still run
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}
    assert not list((node.tmp / "cdi").glob("*.json"))
    assert restarted.driver.unprepare([ref]) == {ref.uid: ""}  # the kubelet repeats
