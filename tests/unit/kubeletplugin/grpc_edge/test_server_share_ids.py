"""What the kubelet hears of a share (consumable capacity) at prepare: over DRA v1 each
share is its own Device entry carrying the allocation's shareID (share_id, 1.35), which
the kubelet keeps and reports through the PodResources API; a device held whole carries
none, and v1beta1 has no field for it. Driven through the DRA socket to the real prepare
over the fake node and the stand-in MPS daemon."""

from __future__ import annotations

import shutil
import tempfile
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dradriver.api import kubelet as kapi
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.grpc_edge.server import PluginServers
from dradriver.kubeletplugin.grpc_edge.servicers import LatePreparer
from dradriver.slices.consumable import parse_mode
from tests.support.gpu_names import names_of
from tests.support.local_daemons import LocalDaemons
from tests.support.node import DRIVER, NODE, fake_preparer

S1, S2 = (str(uuidlib.uuid4()) for _ in range(2))


def share(request: str, device: str, share_id: str, memory: str) -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": share_id,
        "consumedCapacity": {"memory": memory, "compute": "0"},
    }


def claim(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"uid": str(uuidlib.uuid4()), "namespace": "team", "name": name},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": "x"}],
        },
    }


class Node:
    def __init__(self, tmp: Path) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        preparer, _ = fake_preparer(
            tmp,
            "2xH100-80GB",
            lambda ref: self.claims[ref.name],
            mode=MigMode.NONE,
            consumable=parse_mode("memory"),
            mps_protocol=3,
        )
        self.gpus = names_of(preparer.devices())  # whole-GPU names, by NVML index
        late = LatePreparer(patience=5)
        late.set(preparer)
        self.root = Path(tempfile.mkdtemp(prefix="drs-"))  # a Unix socket path stays short
        self.servers = PluginServers(
            late,
            driver_name=DRIVER,
            kubelet_dir=self.root,
            instance="t",
            on_registered=lambda ok, error: None,
        )

    def prepare(self, msgs: Any, stubs: Any, name: str) -> Any:
        c = self.claims[name]["metadata"]
        request = msgs.NodePrepareResourcesRequest(
            claims=[msgs.Claim(namespace=c["namespace"], uid=c["uid"], name=name)]
        )
        with grpc.insecure_channel(f"unix://{self.servers.dra_socket}") as ch:
            resp = stubs.DRAPluginStub(ch).NodePrepareResources(request, timeout=20)
        entry = resp.claims[c["uid"]]
        assert entry.error == ""
        return entry


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    n.servers.start()
    yield n
    n.servers.stop(grace=1)
    shutil.rmtree(n.root, ignore_errors=True)
    LocalDaemons(tmp_path).stop_all()  # never leave a daemon behind, even when a test fails


def test_each_share_of_a_device_is_its_own_entry_with_its_share_id(node: Node) -> None:
    gpu0 = node.gpus[0]
    # One claim, two shares of one device: two entries, told apart by their shareIDs.
    node.claims["two"] = claim("two", [share("a", gpu0, S1, "10Gi"), share("b", gpu0, S2, "20Gi")])
    entry = node.prepare(kapi.dra_v1, kapi.dra_v1_grpc, "two")
    got = sorted(
        (d.share_id, list(d.request_names), d.pool_name, d.device_name) for d in entry.devices
    )
    assert got == sorted([(S1, ["a"], NODE, gpu0), (S2, ["b"], NODE, gpu0)])
    assert all(d.HasField("share_id") for d in entry.devices)
    assert len({cdi for d in entry.devices for cdi in d.cdi_device_ids}) == 2

    # The same claim asked again (the kubelet retries): the same answer, from the record.
    again = node.prepare(kapi.dra_v1, kapi.dra_v1_grpc, "two")
    assert sorted(d.share_id for d in again.devices) == sorted([S1, S2])

    # v1beta1 has no share_id: the same entries, without it.
    beta = node.prepare(kapi.dra_v1beta1, kapi.dra_v1beta1_grpc, "two")
    assert sorted(d.device_name for d in beta.devices) == [gpu0, gpu0]
    assert "share_id" not in type(beta.devices[0]).DESCRIPTOR.fields_by_name


def test_a_device_held_whole_has_no_share_id(node: Node) -> None:
    gpu1 = node.gpus[1]
    node.claims["whole"] = claim(
        "whole", [{"request": "r", "driver": DRIVER, "pool": NODE, "device": gpu1}]
    )
    (d,) = node.prepare(kapi.dra_v1, kapi.dra_v1_grpc, "whole").devices
    assert d.device_name == gpu1
    assert not d.HasField("share_id")  # unset, not "": the kubelet stores no share
