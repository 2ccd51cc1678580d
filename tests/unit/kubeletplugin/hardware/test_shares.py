"""Shares held to their limits (consumable capacity, issue Q9 item 3), over the fake NVML
library and the stand-in MPS daemon, which models MPS v3's namespaces and per-client
limits (fakenvml/mps_v3.py): one daemon per device for all its shares, each share's
limits on the server side, a share past its limit fails alone, and the daemon and the
limits survive a plugin restart and come back after a reboot."""

from __future__ import annotations

import json
import os
import stat
import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.errors import DriverError
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.hardware.sharing import MPS_SHM_SIZE
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.slices.consumable import parse_mode
from fakenvml import FakeNvml
from fakenvml.mps_v3 import CUDA_ERROR_OUT_OF_MEMORY, Client, CudaError, namespaces
from tests.support.crash import Crash, crash_at
from tests.support.gpu_names import names_of, real
from tests.support.local_daemons import LocalDaemons, process_alive
from tests.support.node import DRIVER, NODE, fake_preparer, lose_checkpoint

GI = 2**30


class SharedNode:
    def __init__(self, tmp: Path, protocol: int = 3, boot_id: str = "boot") -> None:
        self.tmp, self.protocol = tmp, protocol
        self.claims: dict[str, dict[str, Any]] = {}
        self.driver, nvml = fake_preparer(
            tmp,
            "2xH100-80GB",
            lambda ref: self.claims[ref.name],
            boot_id=boot_id,
            mode=MigMode.NONE,
            consumable=parse_mode("memory"),
            mps_protocol=protocol,
        )
        self.fake: FakeNvml = nvml.backend
        self.nvml = nvml
        # The whole-GPU names, by NVML index, as discovery made them.
        self.names = names_of(self.driver.devices())

    def share(self, name: str, memory: str, compute: str = "0", device: str = "gpu-0") -> ClaimRef:
        uid = str(uuidlib.uuid4())
        self.claims[name] = {
            "metadata": {"uid": uid, "namespace": "team", "name": name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": real(device, self.names),
                                "shareID": str(uuidlib.uuid4()),
                                "consumedCapacity": {"memory": memory, "compute": compute},
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": "x"}],
            },
        }
        ref = ClaimRef("team", uid, name)
        r = self.driver.prepare([ref])[ref.uid]
        if r.error:
            raise DriverError(r.error)
        return ref

    def env(self, ref: ClaimRef) -> dict[str, str]:
        spec = json.loads((self.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text())
        (dev,) = spec["devices"]
        return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])

    def mounts(self, ref: ClaimRef) -> dict[str, str]:
        spec = json.loads((self.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text())
        (dev,) = spec["devices"]
        return {m["containerPath"]: m["hostPath"] for m in dev["containerEdits"]["mounts"]}

    def client(self, ref: ClaimRef, **env: str) -> Client:
        e = self.env(ref)
        return Client(Path(e["CUDA_MPS_PIPE_DIRECTORY"]), {**e, **env})

    def daemons(self) -> list[int]:
        return [int(p.read_text()) for p in (self.tmp / "mps").glob("*/pipe/control")]

    def pipe(self) -> Path:
        (control,) = (self.tmp / "mps").glob("shared-*/pipe/control")
        return control.parent

    def mode(self, i: int) -> int:
        return int(self.fake.machine.gpus[i].compute_mode)

    def ledger(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.tmp / "ledger.json").read_text())
        return dict(doc.get("shareDaemons") or {})

    def unprepare(self, *refs: ClaimRef) -> None:
        assert self.driver.unprepare(list(refs)) == {r.uid: "" for r in refs}


def restart(node: SharedNode, boot_id: str = "boot") -> SharedNode:
    """The plugin started again over the same state and GPUs, its startup reconciled."""
    again = SharedNode(node.tmp, boot_id=boot_id)
    again.claims = node.claims
    again.driver.reconcile()
    return again


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SharedNode]:
    n = SharedNode(tmp_path)
    yield n
    LocalDaemons(tmp_path).stop_all()  # never leave a daemon behind, even when a test fails


def test_three_shares_run_under_one_daemon_each_in_its_own_namespace(node: SharedNode) -> None:
    a, b, c = (node.share(n, "20Gi", pct) for n, pct in (("a", "30"), ("b", "0"), ("c", "50")))
    (pid,) = node.daemons()
    assert process_alive(pid) and node.mode(0) == 3  # EXCLUSIVE_PROCESS: one MPS server
    assert node.mode(1) == 0
    limits = namespaces(node.pipe())
    assert sorted(limits.values(), key=str) == sorted(
        [
            {"pinned": 20 * GI, "threads": 30},
            {"pinned": 20 * GI},
            {"pinned": 20 * GI, "threads": 50},
        ],
        key=str,
    )
    for ref in (a, b, c):
        env, mounts = node.env(ref), node.mounts(ref)
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe.startswith(str(node.pipe() / "shares")) and pipe in mounts
        assert str(node.pipe()) not in mounts  # only its own namespace is mounted
        # Server side: nothing in the environment a container could unset.
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
        assert env["DRADRIVER_SHARE_MEMORY_LIMIT"] == str(20 * GI)
    assert len({node.env(r)["CUDA_MPS_PIPE_DIRECTORY"] for r in (a, b, c)}) == 3
    # MPS server and clients exchange memory in /dev/shm, so a device's shares have its
    # daemon's: a tmpfs (on a real node) of the configured size, mode 1777.
    shm = node.pipe().parent / "shm"
    assert all(node.mounts(r)["/dev/shm"] == str(shm) for r in (a, b, c))
    assert stat.S_IMODE(shm.stat().st_mode) == 0o1777
    assert (shm.parent / "shm-size").read_text() == str(MPS_SHM_SIZE)
    assert node.client(a).limits() == (20 * GI, 30)
    assert node.client(b).limits() == (20 * GI, None)


def test_a_share_allocating_past_its_limit_fails_and_the_others_are_untouched(
    node: SharedNode,
) -> None:
    a, b = node.share("a", "20Gi"), node.share("b", "8Gi")
    ca, cb = node.client(a), node.client(b)
    ca.allocate(20 * GI)
    with pytest.raises(CudaError) as e:
        ca.allocate(1)
    assert e.value.code == CUDA_ERROR_OUT_OF_MEMORY
    cb.allocate(8 * GI)  # its own limit, whatever a did
    # A container that raises its own variable gets no more: it can only lower it.
    raised = node.client(b, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={40 * 1024}M")
    with pytest.raises(CudaError):
        raised.allocate(9 * GI)
    lowered = node.client(b, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=1G")
    with pytest.raises(CudaError):
        lowered.allocate(2 * GI)


def test_unpreparing_one_share_leaves_the_others_and_the_last_stops_the_daemon(
    node: SharedNode,
) -> None:
    a, b = node.share("a", "20Gi"), node.share("b", "10Gi")
    (pid,) = node.daemons()
    node.unprepare(a)
    assert process_alive(pid) and node.mode(0) == 3
    assert list(namespaces(node.pipe()).values()) == [{"pinned": 10 * GI}]
    node.client(b).allocate(10 * GI)
    (entry,) = node.ledger().values()
    assert list(entry["members"].values()) == [b.uid]
    node.unprepare(b)
    node.unprepare(b)  # the kubelet may repeat
    assert not process_alive(pid) and node.daemons() == []
    assert node.mode(0) == 0 and node.ledger() == {}
    assert list((node.tmp / "mps").iterdir()) == []


def test_the_daemon_and_limits_survive_a_restart_and_come_back_after_a_reboot(
    node: SharedNode,
) -> None:
    a, b = node.share("a", "20Gi", "25"), node.share("b", "30Gi")
    (pid,) = node.daemons()
    before = namespaces(node.pipe())
    restarted = restart(node)
    assert restarted.daemons() == [pid] and namespaces(restarted.pipe()) == before
    os.kill(pid, 15)  # as a reboot would end it
    while process_alive(pid):
        time.sleep(0.01)
    rebooted = restart(node, boot_id="boot-2")
    (again,) = rebooted.daemons()
    assert again != pid and process_alive(again)
    assert namespaces(rebooted.pipe()) == before  # every share's limits, set again
    assert rebooted.client(a).limits() == (20 * GI, 25)
    rebooted.unprepare(a, b)
    assert rebooted.daemons() == [] and rebooted.mode(0) == 0


def test_a_lost_checkpoint_still_stops_the_daemon(node: SharedNode) -> None:
    a, b = node.share("a", "20Gi"), node.share("b", "20Gi")
    (pid,) = node.daemons()
    lose_checkpoint(node.tmp)
    restarted = restart(node)
    assert process_alive(pid)  # kept for the pods that may still use it
    restarted.unprepare(a)
    assert process_alive(pid)
    restarted.unprepare(b)
    assert not process_alive(pid) and restarted.mode(0) == 0 and restarted.ledger() == {}


def test_shares_of_two_gpus_get_a_daemon_each(node: SharedNode) -> None:
    node.share("a", "20Gi", device="gpu-0")
    node.share("b", "20Gi", device="gpu-1")
    assert len(node.daemons()) == 2 and node.mode(0) == node.mode(1) == 3


def test_without_mps_v3_the_limits_are_the_clients_own_variables(tmp_path: Path) -> None:
    node = SharedNode(tmp_path, protocol=2)
    try:
        a = node.share("a", "20Gi", "40")
        env = node.env(a)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(node.pipe())
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        uuid = env["NVIDIA_VISIBLE_DEVICES"]
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}=20480M"
        assert node.client(a).limits() == (20 * GI, 40)
        # The weakness docs/user-guide.md states: a container that unsets them has no limit.
        bare = Client(Path(env["CUDA_MPS_PIPE_DIRECTORY"]), {})
        assert bare.limits() == (None, None)
        node.unprepare(a)
        assert node.daemons() == []
    finally:
        for pid in node.daemons():
            os.kill(pid, 15)


@pytest.mark.parametrize("point", ["intent-recorded", "sharing-applied", "cdi-written"])
def test_a_crash_preparing_a_share_is_undone_at_restart_and_its_neighbour_kept(
    node: SharedNode, point: str
) -> None:
    first = node.share("first", "20Gi")
    (pid,) = node.daemons()

    with crash_at(point), pytest.raises(Crash):
        node.share("second", "30Gi")
    restarted = restart(node)
    # The interrupted share is gone; its neighbour and the daemon are as they were.
    assert list(namespaces(restarted.pipe()).values()) == [{"pinned": 20 * GI}]
    (entry,) = restarted.ledger().values()
    assert list(entry["members"].values()) == [first.uid]
    assert restarted.daemons() == [pid] and process_alive(pid)
    assert set(restarted.driver.store.load().claims) == {first.uid}
    second = restarted.share("second", "30Gi")  # and it can be prepared again
    assert restarted.client(second).limits() == (30 * GI, None)
    restarted.unprepare(first, second)
    assert restarted.daemons() == [] and restarted.mode(0) == 0


def test_a_crash_preparing_the_first_share_leaves_no_daemon(node: SharedNode) -> None:
    with crash_at("sharing-applied"), pytest.raises(Crash):
        node.share("only", "20Gi")
    (pid,) = node.daemons()
    restarted = restart(node)
    assert not process_alive(pid) and restarted.daemons() == []
    assert restarted.mode(0) == 0 and restarted.ledger() == {}


def test_two_instances_in_a_rolling_update_share_one_daemon(node: SharedNode) -> None:
    from concurrent.futures import ThreadPoolExecutor

    other = SharedNode.__new__(SharedNode)
    other.tmp, other.protocol, other.claims = node.tmp, 3, node.claims
    other.fake, other.nvml, other.names = node.fake, node.nvml, node.names
    other.driver, _ = fake_preparer(
        node.tmp,
        "2xH100-80GB",
        lambda ref: node.claims[ref.name],
        boot_id="boot",
        mode=MigMode.NONE,
        consumable=parse_mode("memory"),
        mps_protocol=3,
        nvml=node.nvml,  # the same GPUs: a second plugin process beside the first
    )
    # Both instances prepare shares of gpu-0 at once: one daemon, every share in it.
    with ThreadPoolExecutor(4) as pool:
        refs = list(
            pool.map(
                lambda i: (node if i % 2 else other).share(f"s{i}", "8Gi"),
                range(6),
            )
        )
    (pid,) = node.daemons()
    assert len(namespaces(node.pipe())) == 6
    # Unprepared by the instance that did not prepare them, the last one stops it.
    for i, ref in enumerate(refs):
        (other if i % 2 else node).unprepare(ref)
    assert not process_alive(pid) and node.daemons() == [] and node.mode(0) == 0
