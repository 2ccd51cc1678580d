"""The kubelet's sockets as PluginServers serves them (grpcio's asyncio server), called
with grpcio's client: registration, DRA v1 and v1beta1, errors as statuses, many calls
at once, a call cancelled before its turn never reaching the driver, limits, a graceful
stop, garbage on the socket, and sockets recreated when someone removes them."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.grpc_edge.server import MAX_MESSAGE, PluginServers
from dradriver.kubeletplugin.grpc_edge.servicers import LatePreparer
from dradriver.kubeletplugin.state.records import ClaimRef

V1, V1BETA1 = kapi.dra_v1, kapi.dra_v1beta1
DRIVER = "gpu.dradriver.io"


@dataclass
class Device:
    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str]


@dataclass
class Prepared:
    error: str = ""
    devices: list[Device] = field(default_factory=list)


class FakeDriver:
    """A driver whose answers the tests choose; `gate` holds every call while clear."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.prepared: list[str] = []
        self.running = 0
        self.devices_per_claim = 1

    def prepare(self, refs: list[ClaimRef]) -> Mapping[str, Prepared]:
        with self.lock:
            self.prepared += [r.name for r in refs]
            self.running += 1
        try:
            assert self.gate.wait(20)
            out = {}
            for r in refs:
                if r.name == "boom":
                    raise RuntimeError("the driver broke")
                if r.name.startswith("bad"):
                    out[r.uid] = Prepared(error=f"claim {r}: no such claim")
                    continue
                devices = [
                    Device(["gpu"], "node-a", f"gpu-{i}", [f"{DRIVER}/gpu=gpu-{i}"])
                    for i in range(self.devices_per_claim)
                ]
                out[r.uid] = Prepared(devices=devices)
            return out
        finally:
            with self.lock:
                self.running -= 1

    def unprepare(self, refs: list[ClaimRef]) -> Mapping[str, str]:
        return {r.uid: "" for r in refs}


@dataclass
class Served:
    servers: PluginServers
    driver: FakeDriver
    registered: list[tuple[bool, str]]

    @property
    def dra(self) -> str:
        return f"unix://{self.servers.dra_socket}"

    @property
    def reg(self) -> str:
        return f"unix://{self.servers.reg_socket}"


@pytest.fixture
def served() -> Iterator[Served]:
    root = Path(tempfile.mkdtemp(prefix="drg-"))  # a Unix socket path stays short
    driver = FakeDriver()
    late = LatePreparer(patience=5)
    late.set(driver)
    registered: list[tuple[bool, str]] = []
    servers = PluginServers(
        late,
        driver_name=DRIVER,
        kubelet_dir=root,
        instance="t",
        on_registered=lambda ok, error: registered.append((ok, error)),
        workers=4,
    )
    servers.start()
    yield Served(servers, driver, registered)
    driver.gate.set()
    servers.stop(grace=1)
    shutil.rmtree(root, ignore_errors=True)


def claims(msgs: Any, *names: str) -> Any:
    return msgs.NodePrepareResourcesRequest(
        claims=[msgs.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]
    )


def wait_until(what: str, fn: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_registration_names_the_dra_socket_and_hears_the_kubelets_answer(served: Served) -> None:
    with grpc.insecure_channel(served.reg) as ch:
        stub = kapi.registration_grpc.RegistrationStub(ch)
        info = stub.GetInfo(kapi.registration.InfoRequest(), timeout=5)
        assert info.type == "DRAPlugin" and info.name == DRIVER
        assert info.endpoint == str(served.servers.dra_socket)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        stub.NotifyRegistrationStatus(
            kapi.registration.RegistrationStatus(plugin_registered=False, error="no"), timeout=5
        )
        stub.NotifyRegistrationStatus(
            kapi.registration.RegistrationStatus(plugin_registered=True), timeout=5
        )
    assert served.registered == [(False, "no"), (True, "")]
    # No staging name is left beside the sockets: the kubelet's watcher sees only these.
    assert os.listdir(served.servers.registry_dir) == [served.servers.reg_socket.name]
    assert os.listdir(served.servers.plugin_dir) == [served.servers.dra_socket.name]


@pytest.mark.parametrize("msgs", [V1, V1BETA1], ids=["v1", "v1beta1"])
def test_prepare_and_unprepare_in_both_versions(served: Served, msgs: Any) -> None:
    stubs = {V1: kapi.dra_v1_grpc, V1BETA1: kapi.dra_v1beta1_grpc}
    with grpc.insecure_channel(served.dra) as ch:
        stub = stubs[msgs].DRAPluginStub(ch)
        resp = stub.NodePrepareResources(claims(msgs, "a", "bad-b"), timeout=5)
        assert resp.claims["uid-a"].error == ""
        d = resp.claims["uid-a"].devices[0]
        assert (list(d.request_names), d.pool_name, d.device_name) == (["gpu"], "node-a", "gpu-0")
        assert list(d.cdi_device_ids) == [f"{DRIVER}/gpu=gpu-0"]
        assert "no such claim" in resp.claims["uid-bad-b"].error
        assert not resp.claims["uid-bad-b"].devices
        un = stub.NodeUnprepareResources(
            msgs.NodeUnprepareResourcesRequest(
                claims=[msgs.Claim(namespace="ns", uid="u", name="a")]
            ),
            timeout=5,
        )
        assert un.claims["u"].error == ""


def test_errors_are_grpc_statuses_and_the_server_goes_on(served: Served) -> None:
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.NodePrepareResources(claims(V1, "boom"), timeout=5)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "NodePrepareResources failed: RuntimeError: the driver broke" in (
            err.value.details() or ""
        )
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/no.Such/Method")(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        raw = ch.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff", timeout=5)  # not a NodePrepareResourcesRequest
        # grpcio's answer to a request it cannot parse: the status says why.
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "Error parsing message" in (err.value.details() or "")
        assert stub.NodePrepareResources(claims(V1, "a"), timeout=5).claims


def test_a_message_over_the_limit_is_resource_exhausted(served: Served) -> None:
    big = V1.NodePrepareResourcesRequest(
        claims=[V1.Claim(namespace="ns", uid="u" * 1000, name=f"c{i}") for i in range(5000)]
    )
    assert big.ByteSize() > MAX_MESSAGE
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.NodePrepareResources(big, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.NodePrepareResources(claims(V1, "a"), timeout=5).claims
    assert "c0" not in served.driver.prepared


def test_an_answer_larger_than_the_window_arrives_whole(served: Served) -> None:
    served.driver.devices_per_claim = 4000  # about 0.3 MB, several flow-control windows
    with grpc.insecure_channel(served.dra) as ch:
        resp = kapi.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(claims(V1, "a"), timeout=10)
    assert len(resp.claims["uid-a"].devices) == 4000


def test_calls_run_together_up_to_the_workers_and_the_rest_wait(served: Served) -> None:
    driver = served.driver
    driver.gate.clear()
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        calls = [
            stub.NodePrepareResources.future(claims(V1, f"c{i}"), timeout=20) for i in range(8)
        ]
        wait_until("four calls running", lambda: driver.running == 4)
        time.sleep(0.2)
        assert driver.running == 4 and len(driver.prepared) == 4  # the other four wait
        driver.gate.set()
        assert sorted(k for c in calls for k in c.result().claims) == sorted(
            f"uid-c{i}" for i in range(8)
        )


def test_a_call_cancelled_before_its_turn_never_reaches_the_driver(served: Served) -> None:
    """What makes a rapid reset cheap: a stream reset while it waits for a worker is
    dropped on the loop."""
    driver = served.driver
    driver.gate.clear()
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        busy = [
            stub.NodePrepareResources.future(claims(V1, f"busy{i}"), timeout=20) for i in range(4)
        ]
        wait_until("every worker busy", lambda: driver.running == 4)
        waiting = [
            stub.NodePrepareResources.future(claims(V1, f"w{i}"), timeout=20) for i in range(20)
        ]
        time.sleep(0.2)
        for call in waiting:
            call.cancel()
        short = stub.NodePrepareResources.future(claims(V1, "late"), timeout=0.3)
        time.sleep(0.5)  # its deadline passes while it waits
        driver.gate.set()
        assert all(c.result().claims for c in busy)
        with pytest.raises(grpc.FutureCancelledError):
            waiting[0].result()
        with pytest.raises(grpc.RpcError):
            short.result()
        after = stub.NodePrepareResources(claims(V1, "after"), timeout=5)
        assert after.claims["uid-after"].devices
    assert sorted(driver.prepared) == sorted([*(f"busy{i}" for i in range(4)), "after"])


def test_a_stop_sends_goaway_lets_calls_under_way_finish_and_removes_the_sockets(
    served: Served,
) -> None:
    driver, servers = served.driver, served.servers
    driver.gate.clear()
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        call = stub.NodePrepareResources.future(claims(V1, "a"), timeout=10)
        wait_until("the call running", lambda: driver.running == 1)
        stopper = threading.Thread(target=servers.stop, kwargs={"grace": 10})
        stopper.start()
        time.sleep(0.3)
        # The GOAWAY: a new call on the same connection is refused, not queued.
        with pytest.raises(grpc.RpcError) as err:
            stub.NodePrepareResources(claims(V1, "b"), timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        driver.gate.set()
        assert sorted(call.result().claims) == ["uid-a"]
        stopper.join(10)
        assert not stopper.is_alive()
    assert not servers.dra_socket.exists() and not servers.reg_socket.exists()
    assert "b" not in driver.prepared


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    """Whether the peer closes the connection within `timeout`: end of stream (whatever
    it says first is read and dropped) or a reset; False when it is still open."""
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while s.recv(4096):
            if time.monotonic() > deadline:
                return False  # it keeps talking: not closed
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_garbage_on_the_socket_closes_that_connection_only(served: Served) -> None:
    path = str(served.servers.dra_socket)
    with grpc.insecure_channel(served.dra) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        assert stub.NodePrepareResources(claims(V1, "before"), timeout=5).claims
        states: list[grpc.ChannelConnectivity] = []
        record = states.append
        ch.subscribe(record)
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b""):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                assert closed_by_peer(s, 5), f"the connection that sent {junk!r} is still open"
        # The well-behaved connection opened before the garbage was never dropped, and
        # still serves calls.
        assert stub.NodePrepareResources(claims(V1, "after"), timeout=5).claims
        ch.unsubscribe(record)
        assert states and set(states) == {grpc.ChannelConnectivity.READY}, states


def test_removed_sockets_are_recreated_and_calls_under_way_finish(served: Served) -> None:
    driver, servers = served.driver, served.servers
    driver.gate.clear()
    with grpc.insecure_channel(served.dra) as old:
        call = kapi.dra_v1_grpc.DRAPluginStub(old).NodePrepareResources.future(
            claims(V1, "inflight"), timeout=20
        )
        wait_until("the call running", lambda: driver.running == 1)
        servers.dra_socket.unlink()
        servers.reg_socket.unlink()
        wait_until(
            "both sockets back",
            lambda: servers.dra_socket.exists() and servers.reg_socket.exists(),
        )
        assert (False, "") in served.registered  # to be registered anew
        driver.gate.set()
        assert call.result().claims["uid-inflight"].devices
    time.sleep(1.5)  # past the watch's next looks: the new sockets are left alone
    assert servers.dra_socket.exists() and servers.reg_socket.exists()
    with grpc.insecure_channel(served.dra) as ch:
        assert (
            kapi.dra_v1_grpc.DRAPluginStub(ch)
            .NodePrepareResources(claims(V1, "new"), timeout=5)
            .claims
        )
    with grpc.insecure_channel(served.reg) as ch:
        info = kapi.registration_grpc.RegistrationStub(ch).GetInfo(
            kapi.registration.InfoRequest(), timeout=5
        )
        assert info.endpoint == str(servers.dra_socket)


def test_a_call_before_the_driver_is_set_waits_for_it() -> None:
    root = Path(tempfile.mkdtemp(prefix="drg-"))
    late = LatePreparer(patience=10)
    servers = PluginServers(
        late, driver_name=DRIVER, kubelet_dir=root, instance="", on_registered=lambda o, e: None
    )
    servers.start()
    try:
        driver = FakeDriver()
        threading.Timer(0.3, late.set, args=(driver,)).start()
        with grpc.insecure_channel(f"unix://{servers.dra_socket}") as ch:
            resp = kapi.dra_v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                claims(V1, "early"), timeout=5
            )
        assert resp.claims["uid-early"].devices
        quick = LatePreparer(patience=0.05)
        quick.reason = lambda: "discovering"
        assert (
            "still starting (discovering)" in quick.prepare([ClaimRef("ns", "u", "c")])["u"].error
        )
    finally:
        servers.stop(grace=1)
        shutil.rmtree(root, ignore_errors=True)


HEALTH = {
    "v1": (kapi.health_v1, kapi.health_v1_grpc),
    "v1alpha1": (kapi.health_v1alpha1, kapi.health_v1alpha1_grpc),
}


def test_health_v1_and_v1alpha1_stream_the_same_reports_from_one_feed(served: Served) -> None:
    """What a 1.37 kubelet watches (v1) and what 1.34 to 1.36 watch (v1alpha1), open at
    once: the same devices, each with its message and how long the report holds."""
    why = "xid-79 (NVIDIA XID 79: GPU has fallen off the bus), since 2023-11-14T22:13:20Z"
    state = {"gpu-0": ("Healthy", ""), "gpu-1": ("Unhealthy", why)}
    served.servers.health.attach("node-a", lambda: dict(state))

    def reports(msg: Any) -> list[tuple[str, str, int, int, str]]:
        return [
            (
                d.device.pool_name,
                d.device.device_name,
                d.health,
                d.health_check_timeout_seconds,
                d.message,
            )
            for d in msg.devices
        ]

    with grpc.insecure_channel(served.dra) as ch:
        streams = {
            version: stubs.DRAResourceHealthStub(ch).NodeWatchResources(
                msgs.NodeWatchResourcesRequest(), timeout=10
            )
            for version, (msgs, stubs) in HEALTH.items()
        }
        first = {version: reports(next(s)) for version, s in streams.items()}
        # 3 resends of 10 s: a plugin that stops sending turns Unknown within 30 s.
        assert (
            first["v1"]
            == first["v1alpha1"]
            == [
                ("node-a", "gpu-0", 1, 30, ""),
                ("node-a", "gpu-1", 2, 30, why),
            ]
        )
        wait_until("both streams open", lambda: served.servers.health.streams == 2)
        state["gpu-1"] = ("Unknown", "the last probe could not tell: NVMLError_Unknown")
        served.servers.health.changed()
        second = {version: reports(next(s)) for version, s in streams.items()}
        assert second["v1"] == second["v1alpha1"]
        assert second["v1"][1][2:] == (0, 30, "the last probe could not tell: NVMLError_Unknown")
        for s in streams.values():
            s.cancel()
    wait_until("the streams ended", lambda: served.servers.health.streams == 0)


def test_a_long_health_message_is_cut_as_the_kubelet_cuts_it(served: Served) -> None:
    long = "é" * 1000  # 2000 bytes: the kubelet keeps 1024 bytes
    served.servers.health.attach("node-a", lambda: {"gpu-0": ("Unhealthy", long)})
    msg = served.servers.health.message(kapi.health_v1)
    (d,) = msg.devices
    assert len(d.message.encode()) <= 1024 and d.message.endswith("...")
    assert d.message == "é" * 510 + "..."  # whole characters: 1020 bytes, then "..."
    alpha = served.servers.health.message(kapi.health_v1alpha1)
    assert alpha.devices[0].message == d.message
