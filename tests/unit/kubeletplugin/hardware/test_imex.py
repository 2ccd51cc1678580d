"""IMEX channels at prepare, over a fake GB200 tray: the domain is checked, the node's IMEX
daemon (the fake nvidia-imex, a real process) starts with every node of the domain as
its peers once they have all joined, the channel's device node goes into the CDI spec,
and unprepare, a failed prepare, a crash and a reboot leave no daemon or file behind."""

from __future__ import annotations

import json
import socket
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.api import computedomain as cd
from dradriver.errors import ImexError
from dradriver.inventory.node_devices import MigMode
from dradriver.kubeletplugin.daemons.spec import DaemonRef
from dradriver.kubeletplugin.hardware.imex import ImexSteps
from dradriver.kubeletplugin.prepare.channels import channel_device
from dradriver.kubeletplugin.prepare.plan import ClaimRef
from dradriver.kubeletplugin.state.records import ClaimRecord
from dradriver.slices.imex import node_clique
from fakenvml.imexctl import query
from tests.support.crash import Crash, crash_at
from tests.support.local_daemons import LocalDaemons
from tests.support.node import DRIVER, NODE, fake_preparer, lose_checkpoint

TRAY = Path(__file__).resolve().parents[3] / "data" / "gb200-clique-1.yaml"
ADDRESS = "127.0.0.21"


def _port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return int(s.getsockname()[1])


class ImexNode:
    """The plugin's prepare on one tray, with the ComputeDomains it reads kept here."""

    def __init__(self, tmp: Path, boot_id: str = "boot") -> None:
        self.tmp = tmp
        self.claims: dict[str, dict[str, Any]] = {}
        self.domains: dict[tuple[str, str], dict[str, Any]] = {}
        self.ports = (_port(), _port())
        self.start(boot_id)

    def start(self, boot_id: str = "boot") -> None:
        self.driver, self.nvml = fake_preparer(
            self.tmp,
            f"@{TRAY}",
            lambda ref: self.claims[ref.name],
            mode=MigMode.NONE,
            boot_id=boot_id,
        )
        self.clique = node_clique(self.nvml.discover().inventory)
        assert self.clique is not None
        self.local = LocalDaemons(self.tmp)
        self.driver.executor.imex = ImexSteps(
            self.nvml.host,
            self.local,
            NODE,
            self.tmp,
            self.domain_of,
            lambda: self.clique,
            *self.ports,
            ready_timeout=1.0,
        )

    def domain_of(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.domains.get((namespace, name))
        if found is None:
            raise ImexError(f"ComputeDomain {namespace}/{name} not found")
        return found

    def domain(self, name: str, num_nodes: int = 1, channel: int = 0, **status: Any) -> str:
        uid = str(uuidlib.uuid4())
        nodes = [{"name": NODE, "address": ADDRESS, "ready": False}]
        self.domains[("team", name)] = {
            "metadata": {"namespace": "team", "name": name, "uid": uid},
            "spec": {
                "numNodes": num_nodes,
                "channel": {"resourceClaimTemplate": {"name": f"{name}-ch"}},
            },
            "status": {"clique": self.clique, "channel": channel, "nodes": nodes, **status},
        }
        return uid

    def claim(self, name: str, domain: str, channel: int = 0, config: bool = True) -> ClaimRef:
        uid = str(uuidlib.uuid4())
        d = self.domains[("team", domain)]
        params = {
            "apiVersion": "gpu.dradriver.io/v1alpha1",
            "kind": "ComputeDomainChannelConfig",
            "domain": domain,
            "domainUID": d["metadata"]["uid"],
            "channel": channel,
        }
        self.claims[name] = {
            "metadata": {"uid": uid, "namespace": "team", "name": name},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "channel",
                                "driver": DRIVER,
                                "pool": NODE,
                                "device": "imex-channel",
                            }
                        ],
                        "config": [
                            {
                                "source": "FromClaim",
                                "requests": ["channel"],
                                "opaque": {"driver": DRIVER, "parameters": params},
                            }
                        ]
                        if config
                        else [],
                    }
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuidlib.uuid4())}],
            },
        }
        return ClaimRef("team", uid, name)

    def prepare(self, ref: ClaimRef) -> str:
        return self.driver.prepare([ref])[ref.uid].error

    def record(self, ref: ClaimRef) -> ClaimRecord:
        return self.driver.store.load().claims[ref.uid]

    def daemons(self) -> list[str]:
        """The IMEX daemons running, by pod name."""
        return self.local.names()

    def faults(self, **kw: Any) -> None:
        (self.tmp / "fake-imex-faults.json").write_text(json.dumps(kw))

    def spec(self, ref: ClaimRef) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            (self.tmp / "cdi" / f"{DRIVER}-claim-{ref.uid}.json").read_text()
        )
        return data


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ImexNode]:
    n = ImexNode(tmp_path)
    yield n
    n.local.stop_all()  # never leave a daemon behind, even when a test fails


def test_a_channel_gets_the_domains_daemon_and_its_device_node(node: ImexNode) -> None:
    node.domain("train")
    ref = node.claim("train-0", "train")
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.kind == "imex-channel" and d.imex is not None
    assert (d.imex.address, d.imex.peers, d.imex.channel) == (ADDRESS, (ADDRESS,), 0)
    assert d.imex.daemon is not None and node.local.serving(d.imex.daemon)
    assert node.local.find("imex", **{"dradriver.io/claim-uid": ref.uid})
    config = Path(str(d.imex.config_dir)) / "config.cfg"
    assert f"BIND_INTERFACE_IP={ADDRESS}" in config.read_text()
    assert (config.parent / "nodes_config.cfg").read_text() == f"{ADDRESS}\n"
    assert query(config)["status"] == "READY"
    (dev,) = node.spec(ref)["devices"]
    (nodes,) = [dev["containerEdits"]["deviceNodes"]]
    assert {
        "path": "/dev/nvidia-caps-imex-channels/channel0",
        "type": "c",
        "minor": 0,
    }.items() <= nodes[0].items()
    pod = d.imex.daemon
    assert node.driver.unprepare([ref])[ref.uid] == ""
    assert not node.local.serving(pod) and not config.parent.exists()


def test_until_every_node_has_joined_nothing_starts(node: ImexNode) -> None:
    node.domain("pair", num_nodes=2)
    ref = node.claim("pair-0", "pair")
    err = node.prepare(ref)
    assert "IMEX layer" in err and "1 of 2 nodes of the domain have joined (node-a)" in err
    assert "the kubelet retries" in err
    assert node.daemons() == [] and ref.uid not in node.driver.store.load().claims
    # The other node joins: the next try starts the daemon with both.
    node.domains[("team", "pair")]["status"]["nodes"].append(
        {"name": "node-b", "address": "127.0.0.22"}
    )
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.peers == (ADDRESS, "127.0.0.22")


def test_a_domain_of_another_clique_or_one_made_again_is_refused(node: ImexNode) -> None:
    node.domain("far", clique="a1b2c3d4-0000-4000-8000-000000000009.3")
    err = node.prepare(node.claim("far-0", "far"))
    assert "is in fabric clique a1b2c3d4-0000-4000-8000-000000000009.3" in err
    assert f"this node ({NODE}) is in {node.clique}" in err
    node.domain("again")
    ref = node.claim("again-0", "again")
    node.domains[("team", "again")]["metadata"]["uid"] = str(uuidlib.uuid4())
    assert "was deleted and made again" in node.prepare(ref)
    assert "given only for a ComputeDomain" in node.prepare(
        node.claim("bare2", "again", config=False)
    )
    assert node.daemons() == []


def test_a_daemon_that_never_gets_ready_is_stopped_and_named(node: ImexNode) -> None:
    node.faults(neverReady=True)
    node.domain("stuck")
    ref = node.claim("stuck-0", "stuck")
    err = node.prepare(ref)
    assert "did not answer READY (nvidia-imex-ctl -q: UNAVAILABLE)" in err
    assert node.daemons() == [] and list((node.tmp / "imex").glob("*/config.cfg")) == []
    assert ref.uid not in node.driver.store.load().claims


def test_one_domain_a_node(node: ImexNode) -> None:
    node.domain("one")
    node.domain("two", channel=1)
    assert node.prepare(node.claim("one-0", "one")) == ""
    err = node.prepare(node.claim("two-0", "two", channel=1))
    assert "a node is in one IMEX domain at a time" in err and "team/one" in err
    assert len(node.daemons()) == 1


def test_a_crash_after_the_daemon_started_is_undone_at_startup(node: ImexNode) -> None:
    node.domain("crash")
    ref = node.claim("crash-0", "crash")
    with crash_at("imex-started"), pytest.raises(Crash):
        node.driver.prepare([ref])
    (pod,) = node.daemons()
    node.start()
    node.driver.reconcile()
    assert node.daemons() == [] and not node.local.serving(DaemonRef(pod))
    assert ref.uid not in node.driver.store.load().claims


def test_a_daemon_that_died_runs_again_in_its_pod(node: ImexNode) -> None:
    """Its process killed (an OOM kill): the pod, and so its UID, stays; the kubelet (here
    the next start) runs it again."""
    node.domain("long")
    ref = node.claim("long-0", "long")
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.daemon is not None
    pod = d.imex.daemon
    old = node.local.pid(pod.name)
    node.local.kill(pod.name)
    node.start()
    node.driver.reconcile()
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.daemon == pod and node.local.serving(pod)
    assert node.local.pid(pod.name) != old and d.kind == cd.CHANNEL_TYPE


def test_a_daemon_pod_deleted_by_hand_is_made_again_at_startup(node: ImexNode) -> None:
    node.domain("gone")
    ref = node.claim("gone-0", "gone")
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.daemon is not None
    node.local.stop(d.imex.daemon)
    node.start()
    node.driver.reconcile()
    (again,) = node.record(ref).devices
    assert again.imex is not None and again.imex.daemon is not None
    assert again.imex.daemon.name == d.imex.daemon.name
    assert again.imex.daemon.uid != d.imex.daemon.uid and node.local.serving(again.imex.daemon)


def test_a_daemon_whose_claim_a_lost_checkpoint_forgot_goes_at_unprepare(node: ImexNode) -> None:
    node.domain("lost")
    ref = node.claim("lost-0", "lost")
    assert node.prepare(ref) == ""
    (pod,) = node.daemons()
    lose_checkpoint(node.tmp)
    node.start()
    node.driver.reconcile()
    assert node.daemons() == [pod]  # kept for its pod until the kubelet unprepares the claim
    assert node.driver.unprepare([ref])[ref.uid] == ""
    assert node.daemons() == []


def _prebind(node: ImexNode, ref: ClaimRef) -> None:
    """What the binder does while the scheduler holds the pod (binding conditions)."""
    params = node.claims[ref.name]["status"]["allocation"]["devices"]["config"][0]["opaque"]
    dev = channel_device(
        ref,
        DRIVER,
        NODE,
        request="channel",
        device=cd.CHANNEL_DEVICE,
        configs=(params["parameters"],),
    )
    assert dev.imex is not None and node.driver.executor.imex is not None
    node.driver.executor.imex.prebind(ref.uid, str(ref), dev.imex)


def test_a_daemon_started_before_binding_is_adopted_at_prepare(node: ImexNode) -> None:
    node.domain("early")
    ref = node.claim("early-0", "early")
    _prebind(node, ref)
    (pod,) = node.daemons()
    assert ref.uid not in node.driver.store.load().claims
    steps = node.driver.executor.imex
    assert steps is not None and set(steps.configs()) == {ref.uid}
    pid = node.local.pid(pod)
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.daemon is not None and d.imex.daemon.name == pod
    assert node.local.pid(pod) == pid and node.daemons() == [pod]  # the same process
    assert node.driver.unprepare([ref])[ref.uid] == ""
    assert node.daemons() == []


def test_a_daemon_started_with_other_peers_is_replaced_at_prepare(node: ImexNode) -> None:
    node.domain("moved")
    ref = node.claim("moved-0", "moved")
    _prebind(node, ref)
    (old,) = node.local.find("imex")
    # The node's IMEX address changed before its pod was bound: a new peer list.
    node.domains[("team", "moved")]["status"]["nodes"][0]["address"] = "127.0.0.23"
    assert node.prepare(ref) == ""
    (d,) = node.record(ref).devices
    assert d.imex is not None and d.imex.peers == ("127.0.0.23",)
    assert d.imex.daemon is not None and d.imex.daemon.uid != old[0].uid
    assert not node.local.serving(old[0]) and node.daemons() == [d.imex.daemon.name]


def test_a_daemon_that_never_gets_ready_before_binding_leaves_nothing(node: ImexNode) -> None:
    node.faults(neverReady=True)
    node.domain("late")
    ref = node.claim("late-0", "late")
    with pytest.raises(ImexError, match="the scheduler places the pod again") as exc:
        _prebind(node, ref)
    assert exc.value.reason == "imex_not_ready"
    assert node.daemons() == [] and list((node.tmp / "imex").glob("*")) == []
