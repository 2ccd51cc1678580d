"""One raw HTTP/2 client connection over a Unix socket, for tests that must send what no
gRPC client sends: frames are built and parsed by hyperframe, header blocks by
hpack_literal, and every wait is bounded by a socket timeout or a deadline.

It records what the server said (GOAWAY with its code and when, RST_STREAM codes,
each stream's header blocks, DATA, PING ACKs, WINDOW_UPDATEs) and keeps the
flow-control windows the server grants, for the attacks that play by them.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from hyperframe import frame as hf

from tests.support import hpack_literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# SETTINGS identifiers (RFC 9113 6.5.2).
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 3, 4, 5
CANCEL = 0x8
ERROR_NAMES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY",
    0xD: "HTTP_1_1_REQUIRED",
}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, hex(code))


def grpc_message(payload: bytes, *, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message: 1 flag byte, 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", int(compressed), len(payload)) + payload


def request_headers(path: str, timeout_s: float | None = None) -> list[tuple[str, str]]:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if timeout_s is not None:
        fields.append(("grpc-timeout", f"{int(timeout_s * 1000)}m"))
    return fields


@dataclass
class StreamSeen:
    """What the server sent on one stream."""

    blocks: list[list[tuple[str, str]]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    rst: int | None = None
    ended: bool = False

    def field(self, name: str) -> str | None:
        """The last value of `name` in the stream's header blocks (trailers win)."""
        for block in reversed(self.blocks):
            for n, v in reversed(block):
                if n == name:
                    return v
        return None


@dataclass
class GoAwaySeen:
    at: float  # time.monotonic() when read
    code: int
    last_stream_id: int
    debug: str


class Peer:
    def __init__(self, path: str, *, timeout: float = 5.0, grant_window: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.send_timeout = timeout
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        # Whether DATA the server sends is given back at once (WINDOW_UPDATE): False for
        # a peer that starves the server of window.
        self.grant_window = grant_window
        self._buf = bytearray()
        self.closed_at: float | None = None  # when the server closed (EOF or reset)
        self.goaways: list[GoAwaySeen] = []
        self.streams: dict[int, StreamSeen] = {}
        self.ping_acks = 0
        self.pings_from_server = 0
        self.settings: dict[int, int] = {}
        self.frames_read = 0
        self.hpack_errors = 0
        # Flow control of what we send (RFC 9113 6.9): the server's grants.
        self.conn_window = 65535
        self.stream_windows: dict[int, int] = {}
        self._initial_window = 65535
        self._pending_block: tuple[int, bytearray] | None = None

    # -- sending ---------------------------------------------------------------------------
    def handshake(self, settings: dict[int, int] | None = None) -> None:
        """The preface and our SETTINGS; the dynamic table we allow the server is 0 bytes,
        so its header blocks decode with hpack_literal."""
        ours = {HEADER_TABLE_SIZE: 0, **(settings or {})}
        self.send(PREFACE, hf.SettingsFrame(0, settings=ours))

    def send(self, *chunks: bytes | hf.Frame) -> bool:
        """Sends whole (within the send timeout); False once the connection is gone."""
        if self.closed_at is not None:
            return False
        data = b"".join(c if isinstance(c, bytes) else c.serialize() for c in chunks)
        self.sock.settimeout(self.send_timeout)
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.closed_at = time.monotonic()
            return False
        return True

    def headers(
        self, sid: int, fields: list[tuple[str, str]], *, end_stream: bool = False
    ) -> hf.HeadersFrame:
        flags = {"END_HEADERS", "END_STREAM"} if end_stream else {"END_HEADERS"}
        self.stream_windows.setdefault(sid, self._initial_window)
        return hf.HeadersFrame(sid, data=hpack_literal.encode(fields), flags=flags)

    def window_for(self, sid: int) -> int:
        return min(self.conn_window, self.stream_windows.get(sid, self._initial_window))

    def spend(self, sid: int, n: int) -> None:
        self.conn_window -= n
        self.stream_windows[sid] = self.stream_windows.get(sid, self._initial_window) - n

    def max_frame(self) -> int:
        return self.settings.get(MAX_FRAME_SIZE, 16384)

    # -- receiving -------------------------------------------------------------------------
    def pump(self, timeout: float = 0.0) -> bool:
        """Reads what has arrived, waiting up to `timeout` for the first bytes; False once
        the server has closed the connection."""
        if self.closed_at is not None:
            return False
        wait = max(timeout, 0.0)
        try:
            while True:
                self.sock.settimeout(wait)  # only the first read waits
                wait = 0.0
                try:
                    chunk = self.sock.recv(1 << 20)
                except (BlockingIOError, TimeoutError):
                    break
                if not chunk:
                    self.closed_at = time.monotonic()
                    break
                self._buf += chunk
                self._parse()
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.EBADF):
                raise
            self.closed_at = time.monotonic()
        self._parse()
        return self.closed_at is None

    def wait(self, until: Any, timeout: float) -> bool:
        """Pumps until `until()` holds or the connection closes or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0 or not self.pump(min(left, 0.2)):
                return bool(until())
        return True

    def _parse(self) -> None:
        while len(self._buf) >= 9:
            try:
                frame, length = hf.Frame.parse_frame_header(memoryview(self._buf[:9]))
            except Exception:
                self.closed_at = self.closed_at or time.monotonic()
                self._buf.clear()
                return
            if len(self._buf) < 9 + length:
                return
            body = bytes(self._buf[9 : 9 + length])
            del self._buf[: 9 + length]
            with contextlib.suppress(Exception):
                frame.parse_body(memoryview(body))
                self.frames_read += 1
                self._on_frame(frame)

    def _on_frame(self, frame: hf.Frame) -> None:
        if isinstance(frame, hf.SettingsFrame):
            if "ACK" not in frame.flags:
                self._apply_settings(frame.settings)
                self.send(hf.SettingsFrame(0, flags={"ACK"}))
        elif isinstance(frame, hf.PingFrame):
            if "ACK" in frame.flags:
                self.ping_acks += 1
            else:
                self.pings_from_server += 1
                self.send(hf.PingFrame(0, opaque_data=frame.opaque_data, flags={"ACK"}))
        elif isinstance(frame, hf.GoAwayFrame):
            self.goaways.append(
                GoAwaySeen(
                    time.monotonic(),
                    frame.error_code,
                    frame.last_stream_id,
                    bytes(frame.additional_data).decode(errors="replace"),
                )
            )
        elif isinstance(frame, hf.WindowUpdateFrame):
            if frame.stream_id == 0:
                self.conn_window += frame.window_increment
            else:
                sid = frame.stream_id
                self.stream_windows[sid] = (
                    self.stream_windows.get(sid, self._initial_window) + frame.window_increment
                )
        elif isinstance(frame, hf.RstStreamFrame):
            st = self.streams.setdefault(frame.stream_id, StreamSeen())
            st.rst, st.ended = frame.error_code, True
        elif isinstance(frame, hf.DataFrame):
            st = self.streams.setdefault(frame.stream_id, StreamSeen())
            st.data += frame.data
            st.ended = st.ended or "END_STREAM" in frame.flags
            if frame.flow_controlled_length and self.grant_window:
                # Give back what the server spent, so its answers always flow.
                n = frame.flow_controlled_length
                self.send(
                    hf.WindowUpdateFrame(0, window_increment=n),
                    hf.WindowUpdateFrame(frame.stream_id, window_increment=n),
                )
        elif isinstance(frame, (hf.HeadersFrame, hf.ContinuationFrame)):
            self._on_block(frame)

    def _on_block(self, frame: hf.HeadersFrame | hf.ContinuationFrame) -> None:
        sid = frame.stream_id
        if isinstance(frame, hf.HeadersFrame):
            self._pending_block = (sid, bytearray(frame.data))
            st = self.streams.setdefault(sid, StreamSeen())
            st.ended = st.ended or "END_STREAM" in frame.flags
        elif self._pending_block is not None:
            self._pending_block[1].extend(frame.data)
        if "END_HEADERS" in frame.flags and self._pending_block is not None:
            psid, block = self._pending_block
            self._pending_block = None
            try:
                fields = hpack_literal.decode(bytes(block))
            except hpack_literal.HpackError:
                self.hpack_errors += 1
                fields = []
            self.streams.setdefault(psid, StreamSeen()).blocks.append(fields)

    def _apply_settings(self, settings: dict[int, int]) -> None:
        if INITIAL_WINDOW_SIZE in settings:
            delta = settings[INITIAL_WINDOW_SIZE] - self._initial_window
            self._initial_window = settings[INITIAL_WINDOW_SIZE]
            for sid in self.stream_windows:
                self.stream_windows[sid] += delta
        self.settings.update(settings)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- reporting -------------------------------------------------------------------------
    def goaway_summary(self, since: float) -> list[dict[str, Any]]:
        return [
            {
                "code": error_name(g.code),
                "last_stream_id": g.last_stream_id,
                "debug": g.debug[:200],
                "after_s": round(g.at - since, 3),
            }
            for g in self.goaways
        ]
