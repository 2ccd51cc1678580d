"""The plugin's HTTP/2: frames as plain values, and the server fed the frames that grpc
clients seldom send (padding, priority, CONTINUATION, pings, small windows, protocol
errors) by a raw client built on a second implementation: hyperframe's frames and
hpack's encoder (grpcio's client is the reference for everything else: test_rpc.py)."""

from __future__ import annotations

import random
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest
from hyperframe import frame as hf

from dradriver.api import kubelet as kapi
from dradriver.kubeletplugin.rpc import http2
from dradriver.kubeletplugin.rpc.hpack_decode import Decoder, HpackError
from dradriver.kubeletplugin.rpc.http2 import ConnectionFault, ErrorCode, Flag, FrameType
from dradriver.kubeletplugin.rpc.listener import bind_unix
from dradriver.kubeletplugin.rpc.server import RpcServer, service

V1 = kapi.dra_v1
PATH = f"/{V1.DESCRIPTOR.services_by_name['DRAPlugin'].full_name}/NodePrepareResources"


# -- frames, as plain values --------------------------------------------------------------------


def test_header_blocks_decode_with_hpack() -> None:
    fields = [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"13"),
        (b"grpc-message", b"x" * 300),  # a length over one byte's prefix
        (b"n" * 200, b""),
    ]
    block = http2.encode_headers(fields)
    assert block[:1] == b"\x20"  # the table size update to 0, first
    assert hpack.Decoder().decode(block, raw=True) == fields
    # Never indexed, never added to the decoder's table.
    d = hpack.Decoder()
    d.decode(block, raw=True)
    assert d.header_table.dynamic_entries == type(d.header_table.dynamic_entries)()


def test_our_decoder_reads_what_hpacks_encoder_writes_as_its_table_churns() -> None:
    """Thousands of header lists through one connection's tables: indexed fields, literals
    added and evicted (a 256-byte table), Huffman and plain strings, size updates."""
    rng = random.Random(7)
    enc, dec = hpack.Encoder(), Decoder(max_table_size=4096)
    enc.header_table_size = 256
    names = [b":path", b"content-type", b"grpc-timeout", b"x-custom", b"te", b"user-agent"]
    for i in range(3000):
        fields = [
            (
                rng.choice(names),
                bytes(rng.choice(b"abcdefghij%/9 ") for _ in range(rng.randrange(40))),
            )
            for _ in range(rng.randrange(1, 8))
        ]
        if i % 500 == 0:
            enc.header_table_size = rng.choice([0, 100, 256, 4096])
        block = enc.encode(fields, huffman=bool(i % 3))
        assert dec.decode(block) == fields, i


@pytest.mark.parametrize(
    ("block", "why"),
    [
        (b"\xbe", "not in the table"),  # index 62: the dynamic table is empty
        (b"\x80", "not in the table"),  # index 0
        (b"\x82\x3f\xe1\x1f", "table size"),  # an update after a field
        (b"\x3f\xe2\x1f", "table size"),  # 4097: over what SETTINGS allowed
        (b"\x40\x05ab", "truncated"),
        (b"\x00\x01a\x81\xff", "Huffman"),  # padding that is not the EOS prefix
        (b"\xff\xff\xff\xff\xff\xff\x01", "too long"),
    ],
)
def test_our_decoder_refuses_broken_blocks(block: bytes, why: str) -> None:
    with pytest.raises(HpackError, match=why):
        Decoder().decode(block)


def test_a_header_list_over_its_limit_is_refused() -> None:
    block = hpack.Encoder().encode([("x-big", "v" * 2000)])
    assert Decoder(max_list_size=4096).decode(block) == [(b"x-big", b"v" * 2000)]
    with pytest.raises(HpackError, match="header list"):
        Decoder(max_list_size=1000).decode(block)


def test_a_large_header_block_goes_on_in_continuation_frames() -> None:
    block = bytes(range(256)) * 160  # 40,960 bytes
    out = http2.headers_frames(3, block, end_stream=True, max_frame=16_384)
    frames, at = [], 0
    while at < len(out):
        f, n = hf.Frame.parse_frame_header(memoryview(out[at : at + 9]))
        f.parse_body(memoryview(out[at + 9 : at + 9 + n]))
        frames.append(f)
        at += 9 + n
    assert [type(f).__name__ for f in frames] == [
        "HeadersFrame",
        "ContinuationFrame",
        "ContinuationFrame",
    ]
    assert frames[0].flags == {"END_STREAM"} and frames[-1].flags == {"END_HEADERS"}
    assert b"".join(f.data for f in frames) == block and {f.stream_id for f in frames} == {3}


def test_padding_longer_than_its_frame_is_a_protocol_error() -> None:
    head = http2.FrameHead(4, FrameType.DATA, Flag.PADDED, 1)
    assert http2.unpad(head, b"\x02abc") == b"a"
    with pytest.raises(ConnectionFault) as e:
        http2.unpad(head, b"\x04abc")
    assert e.value.code == ErrorCode.PROTOCOL_ERROR


# -- the server, fed by a raw client ------------------------------------------------------------


class Dra:
    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        r = V1.NodePrepareResourcesResponse()
        for c in request.claims:
            r.claims[c.uid].devices.add(pool_name="node-a", device_name=f"gpu-{c.name}")
        return r

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        return V1.NodeUnprepareResourcesResponse()


@pytest.fixture
def sock_path() -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="drh2-"))  # a Unix socket path stays short
    server = RpcServer(service(V1, "DRAPlugin", Dra()), 4, "t", bind_unix(root / "s.sock"))
    server.start()
    yield str(root / "s.sock")
    server.stop(None).wait(5)
    shutil.rmtree(root, ignore_errors=True)


def request_body(*names: str) -> bytes:
    msg = V1.NodePrepareResourcesRequest(
        claims=[V1.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]
    ).SerializeToString()
    return struct.pack(">BI", 0, len(msg)) + msg


@dataclass
class Answer:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    reset: int | None = None

    def devices(self) -> list[str]:
        assert dict(self.trailers).get(b"grpc-status") == b"0", self
        msg = V1.NodePrepareResourcesResponse.FromString(self.data[5:])
        return sorted(d.device_name for c in msg.claims.values() for d in c.devices)


class Raw:
    """An HTTP/2 client that sends what it is told, frame by frame."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.enc, self.dec = hpack.Encoder(), hpack.Decoder()
        self.buf = b""
        self.seen: list[hf.Frame] = []

    def hello(self, settings: dict[int, int] | None = None) -> bytes:
        return http2.PREFACE + hf.SettingsFrame(0, settings=settings or {}).serialize()

    def block(self, path: str = PATH) -> bytes:
        return bytes(
            self.enc.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", path),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ]
            )
        )

    def request(self, sid: int, *names: str) -> list[hf.Frame]:
        """A whole unary request on stream `sid`: its HEADERS, then its one DATA."""
        return [
            hf.HeadersFrame(sid, self.block(), flags=["END_HEADERS"]),
            hf.DataFrame(sid, request_body(*names), flags=["END_STREAM"]),
        ]

    def send(self, *chunks: bytes | hf.Frame) -> None:
        self.sock.sendall(b"".join(c.serialize() if isinstance(c, hf.Frame) else c for c in chunks))

    def frame(self) -> hf.Frame | None:
        """The server's next frame; None once it has closed the connection."""
        while True:
            if len(self.buf) >= 9:
                f, n = hf.Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) >= 9 + n:
                    f.parse_body(memoryview(self.buf[9 : 9 + n]))
                    self.buf = self.buf[9 + n :]
                    self.seen.append(f)
                    return f
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self.buf += data

    def answer(self, sid: int) -> Answer:
        out, block = Answer(), b""
        while (f := self.frame()) is not None:
            if isinstance(f, hf.SettingsFrame) and "ACK" not in f.flags:
                self.send(hf.SettingsFrame(0, flags=["ACK"]))
            if f.stream_id != sid:
                continue
            if isinstance(f, hf.RstStreamFrame):
                out.reset = f.error_code
                return out
            if isinstance(f, hf.DataFrame):
                out.data += f.data
            if isinstance(f, (hf.HeadersFrame, hf.ContinuationFrame)):
                block += f.data
                if "END_HEADERS" in f.flags:
                    fields = self.dec.decode(block, raw=True)
                    (out.trailers if out.headers else out.headers).extend(fields)
                    block = b""
            if "END_STREAM" in f.flags:
                if not out.trailers:  # trailers-only
                    out.trailers = out.headers
                return out
        raise AssertionError(f"connection closed before stream {sid} ended: {self.seen}")

    def goaway(self) -> hf.GoAwayFrame:
        while (f := self.frame()) is not None:
            if isinstance(f, hf.GoAwayFrame):
                assert self.frame() is None  # and then the connection is closed
                return f
        raise AssertionError(f"no GOAWAY: {self.seen}")


def test_a_request_in_the_same_write_as_the_preface_is_answered(sock_path: str) -> None:
    c = Raw(sock_path)
    c.send(c.hello(), *c.request(1, "a"))
    assert c.answer(1).devices() == ["gpu-a"]


def test_padded_and_prioritised_frames_are_read(sock_path: str) -> None:
    c = Raw(sock_path)
    body = request_body("a", "b")
    headers = hf.HeadersFrame(
        1,
        c.block(),
        flags=["END_HEADERS", "PADDED", "PRIORITY"],
        pad_length=7,
        depends_on=0,
        stream_weight=200,
    )
    c.send(
        c.hello(),
        headers,
        hf.PriorityFrame(1, depends_on=0, stream_weight=10),
        hf.DataFrame(1, body[:10], flags=["PADDED"], pad_length=3),
        hf.DataFrame(1, body[10:], flags=["PADDED", "END_STREAM"], pad_length=0),
    )
    assert c.answer(1).devices() == ["gpu-a", "gpu-b"]


def test_a_header_block_in_continuation_frames_is_read(sock_path: str) -> None:
    c = Raw(sock_path)
    block = c.block()
    c.send(
        c.hello(),
        hf.HeadersFrame(1, block[:3]),
        hf.ContinuationFrame(1, block[3:9]),
        hf.ContinuationFrame(1, block[9:], flags=["END_HEADERS"]),
        hf.DataFrame(1, request_body("a"), flags=["END_STREAM"]),
    )
    assert c.answer(1).devices() == ["gpu-a"]
    # Another stream's frame in the middle of a block breaks the protocol.
    c.send(hf.HeadersFrame(3, block[:3]), hf.DataFrame(1, b"x"))
    assert c.goaway().error_code == ErrorCode.PROTOCOL_ERROR


def test_pings_are_answered_and_unknown_frames_ignored(sock_path: str) -> None:
    c = Raw(sock_path)
    body = b"what is this"  # (hyperframe's ExtensionFrame serializes a length of 0)
    unknown = struct.pack(">HBBBL", 0, len(body), 0xFA, 0, 1) + body
    c.send(
        c.hello(),
        hf.PingFrame(0, b"12345678"),
        hf.HeadersFrame(1, c.block(), flags=["END_HEADERS"]),
        unknown,
        hf.DataFrame(1, request_body("a"), flags=["END_STREAM"]),
    )
    assert c.answer(1).devices() == ["gpu-a"]
    pongs = [f for f in c.seen if isinstance(f, hf.PingFrame)]
    assert [(f.opaque_data, f.flags) for f in pongs] == [(b"12345678", {"ACK"})]


def test_an_answer_waits_for_the_peers_window(sock_path: str) -> None:
    c = Raw(sock_path)
    names = [f"claim-{i:03d}" for i in range(40)]  # an answer of over 1,000 bytes
    c.send(
        c.hello({hf.SettingsFrame.INITIAL_WINDOW_SIZE: 100}),
        *c.request(1, *names),
    )
    early = b""
    while len(early) < 100:
        f = c.frame()
        assert f is not None
        if isinstance(f, hf.DataFrame):
            early += f.data
    c.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        c.frame()  # no more than the window, until it grows
    c.sock.settimeout(10)
    c.send(hf.WindowUpdateFrame(1, window_increment=1 << 20))
    a = c.answer(1)
    a.data = early + a.data
    assert len(early) == 100 and len(a.data) > 1000
    assert a.devices() == sorted(f"gpu-{n}" for n in names)


def test_a_broken_header_block_ends_the_connection_only(sock_path: str) -> None:
    c = Raw(sock_path)
    c.send(c.hello(), hf.HeadersFrame(1, b"\xbf\xff\xff\x7f", flags=["END_HEADERS"]))
    assert c.goaway().error_code == ErrorCode.COMPRESSION_ERROR
    with grpc.insecure_channel(f"unix://{sock_path}") as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        assert stub.NodePrepareResources(V1.NodePrepareResourcesRequest(), timeout=5) is not None


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([hf.HeadersFrame(2, b"\x83", flags=["END_HEADERS"])], ErrorCode.PROTOCOL_ERROR),
        ([hf.DataFrame(5, b"x")], ErrorCode.PROTOCOL_ERROR),  # an idle stream
        ([hf.ContinuationFrame(1, b"\x83")], ErrorCode.PROTOCOL_ERROR),
        ([hf.WindowUpdateFrame(0, window_increment=(1 << 31) - 1)], ErrorCode.FLOW_CONTROL_ERROR),
        ([hf.SettingsFrame(0, settings={hf.SettingsFrame.MAX_FRAME_SIZE: 10})], 0x1),
        ([b"\x00\x40\x01\x00\x00\x00\x00\x00\x01" + b"\x00" * 0x4001], ErrorCode.FRAME_SIZE_ERROR),
    ],
    ids=[
        "even-stream",
        "idle-stream",
        "stray-continuation",
        "window-overflow",
        "frame-size",
        "big",
    ],
)
def test_protocol_errors_end_the_connection_with_their_code(
    sock_path: str, frames: list[Any], code: int
) -> None:
    c = Raw(sock_path)
    c.send(c.hello(), *frames)
    assert c.goaway().error_code == code


def test_data_on_a_finished_stream_resets_that_stream_only(sock_path: str) -> None:
    c = Raw(sock_path)
    c.send(c.hello(), *c.request(1, "a"))
    assert c.answer(1).devices() == ["gpu-a"]
    c.send(hf.DataFrame(1, b"late"))
    assert c.answer(1).reset == ErrorCode.STREAM_CLOSED
    c.send(*c.request(3, "b"))
    assert c.answer(3).devices() == ["gpu-b"]


def test_a_request_larger_than_the_window_arrives_whole(sock_path: str) -> None:
    names = [f"{i:06d}-" + "n" * 90 for i in range(30_000)]  # about 3.3 MB: 3 windows
    with grpc.insecure_channel(
        f"unix://{sock_path}",
        options=[("grpc.max_receive_message_length", 64 << 20)],
    ) as ch:
        stub = kapi.dra_v1_grpc.DRAPluginStub(ch)
        req = V1.NodePrepareResourcesRequest(
            claims=[V1.Claim(namespace="ns", uid=f"uid-{n}", name=n) for n in names]
        )
        assert req.ByteSize() > 3 << 20
        r = stub.NodePrepareResources(req, timeout=60)
    assert len(r.claims) == len(names)
