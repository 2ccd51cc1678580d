"""The plugin's own gRPC server (kubeletplugin/rpc/), called with grpcio's client (the
reference implementation; the kubelet's is grpc-go, in the e2e tests): unary and
streaming calls, errors as gRPC statuses, flow control for answers larger than the
peer's window, many calls at once on one connection, cancellation, a graceful stop, and
garbage on the socket. Then gRPC's framing as plain values."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.rpc.framing import (
    FramingError,
    Status,
    frame,
    messages,
    one_message,
    percent_decode,
    percent_encode,
    request_problem,
)
from dradriver.kubeletplugin.rpc.listener import bind_unix
from dradriver.kubeletplugin.rpc.server import RpcServer, service

V1 = kapi.dra_v1


class Dra:
    """A DRA service whose answers the tests choose."""

    def __init__(self) -> None:
        self.devices_per_claim = 1
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        self.calls += 1
        assert self.gate.wait(10)
        resp = V1.NodePrepareResourcesResponse()
        for c in request.claims:
            if c.name == "boom":
                raise RuntimeError("the driver broke")
            for i in range(self.devices_per_claim):
                resp.claims[c.uid].devices.add(
                    request_names=["r"], pool_name="node-a", device_name=f"gpu-{i}" + "x" * 64
                )
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return V1.NodeUnprepareResourcesResponse()


class Health:
    def __init__(self) -> None:
        self.ended = threading.Event()

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        context.add_callback(self.ended.set)
        msgs = kapi.health_v1alpha1
        n = 0
        while context.is_active():
            resp = msgs.NodeWatchResourcesResponse()
            for i in range(2000):  # ~150 KB: more than one flow-control window
                resp.devices.add(
                    device=msgs.DeviceIdentifier(pool_name="node-a", device_name=f"gpu-{n}-{i}")
                )
            yield resp
            n += 1
            time.sleep(0.01)


@pytest.fixture
def served() -> Iterator[tuple[RpcServer, str, Dra, Health]]:
    root = Path(tempfile.mkdtemp(prefix="drrpc-"))  # a Unix socket path stays short
    dra, health = Dra(), Health()
    methods = {
        **service(V1, "DRAPlugin", dra),
        **service(kapi.health_v1alpha1, "DRAResourceHealth", health),
    }
    server = RpcServer(methods, 16, "t", bind_unix(root / "s.sock"))
    server.start()
    yield server, f"unix://{root / 's.sock'}", dra, health
    server.stop(None).wait(5)
    shutil.rmtree(root, ignore_errors=True)


def prepare_stub(ch: grpc.Channel) -> Any:
    return kapi.dra_v1_grpc.DRAPluginStub(ch)


def claims(*names: str) -> Any:
    return V1.NodePrepareResourcesRequest(
        claims=[V1.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]
    )


def test_a_unary_call_is_answered(served: Any) -> None:
    _, target, _, _ = served
    with grpc.insecure_channel(target) as ch:
        resp = prepare_stub(ch).NodePrepareResources(claims("a", "b"), timeout=5)
    assert sorted(resp.claims) == ["uid-a", "uid-b"]
    assert resp.claims["uid-a"].devices[0].pool_name == "node-a"


def test_an_answer_larger_than_the_window_arrives_whole(served: Any) -> None:
    _, target, dra, _ = served
    dra.devices_per_claim = 4000  # about 0.5 MB, eight times the initial window
    with grpc.insecure_channel(target) as ch:
        resp = prepare_stub(ch).NodePrepareResources(claims("a"), timeout=10)
    assert len(resp.claims["uid-a"].devices) == 4000


def test_errors_are_grpc_statuses_and_the_server_goes_on(served: Any) -> None:
    _, target, _, _ = served
    with grpc.insecure_channel(target) as ch:
        with pytest.raises(grpc.RpcError) as err:
            prepare_stub(ch).NodePrepareResources(claims("boom"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "the driver broke" in (err.value.details() or "")
        unknown = ch.unary_unary("/no.Such/Method")
        with pytest.raises(grpc.RpcError) as err:
            unknown(b"", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/no.Such/Method" in (err.value.details() or "")
        raw = ch.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources")
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff", timeout=5)  # not a NodePrepareResourcesRequest
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "could not parse the request" in (err.value.details() or "")
        assert prepare_stub(ch).NodePrepareResources(claims("a"), timeout=5).claims


def test_sixteen_calls_at_once_on_one_connection(served: Any) -> None:
    _, target, dra, _ = served
    dra.gate.clear()
    with grpc.insecure_channel(target) as ch:
        stub = prepare_stub(ch)
        calls = [stub.NodePrepareResources.future(claims(f"c{i}"), timeout=10) for i in range(16)]
        deadline = time.monotonic() + 5
        while dra.calls < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dra.calls == 16  # all running together, none queued behind another
        dra.gate.set()
        assert [sorted(c.result().claims) for c in calls] == [[f"uid-c{i}"] for i in range(16)]


def test_a_cancelled_stream_ends_its_call(served: Any) -> None:
    _, target, _, health = served
    with grpc.insecure_channel(target) as ch:
        stub = kapi.health_v1alpha1_grpc.DRAResourceHealthStub(ch)
        stream = stub.NodeWatchResources(kapi.health_v1alpha1.NodeWatchResourcesRequest())
        first, second = next(stream), next(stream)
        assert len(first.devices) == len(second.devices) == 2000
        assert first.devices[0].device.device_name == "gpu-0-0"
        stream.cancel()
        assert health.ended.wait(5)


def test_a_stop_lets_calls_under_way_finish_and_refuses_new_ones(served: Any) -> None:
    server, target, dra, _ = served
    dra.gate.clear()
    with grpc.insecure_channel(target) as ch:
        call = prepare_stub(ch).NodePrepareResources.future(claims("a"), timeout=10)
        deadline = time.monotonic() + 5
        while dra.calls < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped = server.stop(5)
        threading.Timer(0.2, dra.gate.set).start()
        assert sorted(call.result().claims) == ["uid-a"]
        assert stopped.wait(5)
    with grpc.insecure_channel(target) as ch, pytest.raises(grpc.RpcError) as err:
        prepare_stub(ch).NodePrepareResources(claims("b"), timeout=2)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_garbage_on_the_socket_closes_that_connection_only(served: Any) -> None:
    _, target, _, _ = served
    path = target.removeprefix("unix://")
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b""):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(junk)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
    with grpc.insecure_channel(target) as ch:
        assert prepare_stub(ch).NodePrepareResources(claims("a"), timeout=5).claims


# -- framing, as plain values -------------------------------------------------------------------


def test_messages_are_length_prefixed() -> None:
    body = frame(b"abc") + frame(b"")
    assert body == b"\x00\x00\x00\x00\x03abc\x00\x00\x00\x00\x00"
    assert list(messages(body, 10)) == [b"abc", b""]
    assert one_message(frame(b"x"), 10) == b"x"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"\x01\x00\x00\x00\x01x", Status.UNIMPLEMENTED, "compressed"),
        (b"\x00\x00\x00", Status.INTERNAL, "truncated gRPC message prefix"),
        (b"\x00\x00\x00\x00\x09abc", Status.INTERNAL, "truncated gRPC message"),
        (b"\x00\x00\x00\x01\x00" + b"x" * 256, Status.RESOURCE_EXHAUSTED, "exceeds the limit"),
        (frame(b"a") + frame(b"b"), Status.INTERNAL, "exactly one request message, got 2"),
        (b"", Status.INTERNAL, "exactly one request message, got 0"),
    ],
)
def test_bad_bodies_are_refused_with_a_status(body: bytes, status: Status, words: str) -> None:
    with pytest.raises(FramingError) as err:
        one_message(body, 100)
    assert err.value.status is status and words in str(err.value)


def test_grpc_message_is_percent_encoded() -> None:
    text = "claim ns/a: 100% wrong\nnext line ü"
    encoded = percent_encode(text)
    assert encoded == b"claim ns/a: 100%25 wrong%0Anext line %C3%BC"
    assert percent_decode(encoded) == text


def test_what_is_not_a_grpc_request() -> None:
    ok = {b":method": b"POST", b"content-type": b"application/grpc"}
    assert request_problem(ok) == ""
    assert request_problem({**ok, b"content-type": b"application/grpc+proto"}) == ""
    assert "is not POST" in request_problem({**ok, b":method": b"GET"})
    assert "content-type 'text/html'" in request_problem({**ok, b"content-type": b"text/html"})
    assert "grpc-encoding 'gzip'" in request_problem({**ok, b"grpc-encoding": b"gzip"})


def test_a_failed_accept_is_retried_not_the_end_of_the_socket() -> None:
    """Out of file descriptors for a moment: the server keeps its socket and serves the
    next connection."""
    root = Path(tempfile.mkdtemp(prefix="drrpc-"))
    real = bind_unix(root / "s.sock")

    class Flaky:
        failures = 2

        def accept(self) -> Any:
            if self.failures:
                self.failures -= 1
                raise OSError(24, "Too many open files")
            return real.accept()

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    server = RpcServer(service(V1, "DRAPlugin", Dra()), 2, "t", Flaky())  # type: ignore[arg-type]
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{root / 's.sock'}") as ch:
            assert prepare_stub(ch).NodePrepareResources(claims("a"), timeout=5).claims
    finally:
        server.stop(None).wait(5)
        shutil.rmtree(root, ignore_errors=True)
