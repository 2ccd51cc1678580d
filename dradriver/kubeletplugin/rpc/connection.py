"""One client's HTTP/2 connection, server side (RFC 9113): what a gRPC server of unary
and server-streaming calls needs, frames from http2.py.

Why not the h2 library (which this server used first): its general state machine, event
objects and frame classes cost about 0.6 ms of CPU a call on this project's 2-core
machine, a third of the plugin's CPU per prepare+unprepare cycle at concurrency 16. A
gRPC server needs little of HTTP/2: requests arrive whole before they are answered, the
server never pushes, never sends a priority, and never needs the dynamic HPACK table.

Threads: the connection's own thread reads and parses (`run`); calls' threads write
their answers. All state is changed under `cond`, which senders waiting for a
flow-control window also wait on.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dradriver.kubeletplugin.rpc import http2
from dradriver.kubeletplugin.rpc.hpack_decode import Decoder, HpackError
from dradriver.kubeletplugin.rpc.http2 import (
    ConnectionFault,
    ErrorCode,
    Flag,
    FrameHead,
    FrameType,
    Setting,
    StreamFault,
)
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.rpc")

# Windows this server opens for requests. Requests are small; a large window keeps the
# peer from waiting for WINDOW_UPDATEs, which are sent once half of one is used.
RECEIVE_WINDOW = 1 << 20
MAX_STREAMS = 128
MAX_HEADER_LIST = 64 << 10
# A peer that opens no flow-control window for this long has gone: the call ends.
SEND_STALL_SECONDS = 60.0

_OUR_SETTINGS = http2.settings(
    {
        Setting.ENABLE_PUSH: 0,
        Setting.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
        Setting.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
        Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    }
) + http2.window_update(0, RECEIVE_WINDOW - http2.DEFAULT_WINDOW)


class Gone(Exception):
    """The stream was reset or the connection closed: nobody to answer."""


@dataclass(eq=False)
class Stream:
    id: int
    headers: dict[bytes, bytes]
    send_window: int
    body: bytearray = field(default_factory=bytearray)
    received: bool = False  # the request is whole (END_STREAM seen)
    unacked: int = 0  # request bytes not yet given back in a WINDOW_UPDATE
    started: bool = False  # response headers sent
    done: bool = False
    callbacks: list[Callable[[], None]] = field(default_factory=list)

    def end(self) -> list[Callable[[], None]]:
        """Marks it over; the callbacks to run (outside any lock)."""
        if self.done:
            return []
        self.done = True
        out, self.callbacks = self.callbacks, []
        return out


def run_callbacks(callbacks: list[Callable[[], None]]) -> None:
    for fn in callbacks:
        try:
            fn()
        except Exception as exc:  # a callback's bug must not take the connection down
            log.error("RPC callback failed", error=f"{type(exc).__name__}: {exc}")


@dataclass
class _HeaderBlock:
    """A HEADERS frame whose block goes on in CONTINUATION frames."""

    stream_id: int
    end_stream: bool
    fragments: list[bytes]


class Connection:
    """`dispatch(conn, stream)` is called (on this connection's thread, outside the lock)
    for each whole request; `closed(conn)` once, when the connection is over. A request
    body over `max_body` bytes resets its stream."""

    def __init__(
        self,
        sock: socket.socket,
        dispatch: Callable[[Connection, Stream], None],
        closed: Callable[[Connection], None],
        max_body: int,
    ) -> None:
        self.sock = sock
        self._dispatch, self._closed, self._max_body = dispatch, closed, max_body
        self.cond = threading.Condition()
        self.streams: dict[int, Stream] = {}
        self.closed = False
        self._decoder = Decoder(max_list_size=MAX_HEADER_LIST)
        self._last_stream = 0
        self._block: _HeaderBlock | None = None
        self._send_window = http2.DEFAULT_WINDOW
        self._recv_unacked = 0
        self._peer_initial_window = http2.DEFAULT_WINDOW
        self._peer_max_frame = http2.DEFAULT_MAX_FRAME
        self._out: list[bytes] = []

    # -- reading (the connection's own thread) ------------------------------------------------
    def run(self) -> None:
        try:
            with self.cond:
                self._out.append(_OUR_SETTINGS)
                self._flush()
            buf = self._receive(self._preface())
            while not self.closed:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf = self._receive(buf + data if buf else data)
        except ConnectionFault as exc:
            log.warning(
                "HTTP/2 protocol error from a client; closing",
                error=str(exc),
                code=exc.code.name,
            )
            with contextlib.suppress(OSError, Gone), self.cond:
                self._out.append(http2.goaway(self._last_stream, exc.code, str(exc).encode()))
                self._flush()
        except (OSError, Gone):
            pass
        finally:
            self.close()

    def _preface(self) -> bytes:
        buf = b""
        while len(buf) < len(http2.PREFACE):
            data = self.sock.recv(1 << 16)
            if not data:
                raise Gone
            buf += data
            if not http2.PREFACE.startswith(buf[: len(http2.PREFACE)]):
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "not the HTTP/2 client preface")
        return buf[len(http2.PREFACE) :]

    def _receive(self, buf: bytes) -> bytes:
        """Handles every whole frame in `buf`; returns what is left of it."""
        ready: list[Stream] = []
        ended: list[Callable[[], None]] = []
        at, size = 0, len(buf)
        with self.cond:
            try:
                while size - at >= http2.HEADER_SIZE:
                    head = http2.parse_head(buf, at)
                    if head.length > http2.DEFAULT_MAX_FRAME:
                        raise ConnectionFault(
                            ErrorCode.FRAME_SIZE_ERROR, f"a frame of {head.length} bytes"
                        )
                    end = at + http2.HEADER_SIZE + head.length
                    if end > size:
                        break
                    payload = buf[at + http2.HEADER_SIZE : end]
                    at = end
                    try:
                        self._frame(head, payload, ready, ended)
                    except StreamFault as exc:
                        self._out.append(http2.rst_stream(exc.stream_id, exc.code))
                        st = self.streams.pop(exc.stream_id, None)
                        if st is not None:
                            ended += st.end()
            finally:
                self._flush()
                self.cond.notify_all()  # window updates, resets: senders look again
        run_callbacks(ended)
        for st in ready:
            self._dispatch(self, st)
        return buf[at:]

    def _frame(
        self,
        head: FrameHead,
        payload: bytes,
        ready: list[Stream],
        ended: list[Callable[[], None]],
    ) -> None:
        t = head.type
        if self._block is not None and (
            t != FrameType.CONTINUATION or head.stream_id != self._block.stream_id
        ):
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "a header block left unfinished")
        if t == FrameType.DATA:
            self._data(head, payload, ready)
        elif t == FrameType.HEADERS:
            self._headers(head, payload, ready)
        elif t == FrameType.CONTINUATION:
            if self._block is None:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._fragment(payload, head.flags & Flag.END_HEADERS, ready)
        elif t == FrameType.WINDOW_UPDATE:
            self._window_update(head, payload)
        elif t == FrameType.PING:
            if len(payload) != 8:
                raise ConnectionFault(ErrorCode.FRAME_SIZE_ERROR, "PING length not 8")
            if head.stream_id:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if not head.flags & http2.ACK:
                self._out.append(http2.ping_ack(payload))
        elif t == FrameType.SETTINGS:
            self._settings(head, payload)
        elif t == FrameType.RST_STREAM:
            if not head.stream_id or len(payload) != 4:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "a malformed RST_STREAM")
            st = self.streams.pop(head.stream_id, None)
            if st is not None:
                ended += st.end()
        elif t == FrameType.PRIORITY:
            if len(payload) != 5:
                raise StreamFault(head.stream_id, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY")
        elif t == FrameType.PUSH_PROMISE:
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif t == FrameType.GOAWAY:
            pass  # the peer opens no new streams; those open are answered
        # Frames of unknown types are ignored (RFC 9113 4.1).

    def _data(self, head: FrameHead, payload: bytes, ready: list[Stream]) -> None:
        sid, n = head.stream_id, len(payload)
        if not sid:
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        # The connection's window is RECEIVE_WINDOW less what is not given back yet.
        self._recv_unacked += n
        if self._recv_unacked > RECEIVE_WINDOW:
            raise ConnectionFault(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the window")
        if self._recv_unacked >= RECEIVE_WINDOW // 2:
            self._out.append(http2.window_update(0, self._recv_unacked))
            self._recv_unacked = 0
        st = self.streams.get(sid)
        if st is None or st.received:
            if sid > self._last_stream:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            raise StreamFault(sid, ErrorCode.STREAM_CLOSED, "DATA on a closed stream")
        st.unacked += n
        if st.unacked > RECEIVE_WINDOW:
            raise StreamFault(sid, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the window")
        st.body += http2.unpad(head, payload)
        if len(st.body) > self._max_body:
            raise StreamFault(sid, ErrorCode.REFUSED_STREAM, "request too large")
        if head.flags & Flag.END_STREAM:
            st.received = True
            ready.append(st)
        elif st.unacked >= RECEIVE_WINDOW // 2:
            self._out.append(http2.window_update(sid, st.unacked))
            st.unacked = 0

    def _headers(self, head: FrameHead, payload: bytes, ready: list[Stream]) -> None:
        sid = head.stream_id
        if not sid or not sid & 1:
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        fragment = http2.header_fragment(head, payload)
        self._block = _HeaderBlock(sid, bool(head.flags & Flag.END_STREAM), [])
        self._fragment(fragment, head.flags & Flag.END_HEADERS, ready)

    def _fragment(self, fragment: bytes, last: int, ready: list[Stream]) -> None:
        block = self._block
        assert block is not None
        block.fragments.append(fragment)
        if sum(map(len, block.fragments)) > MAX_HEADER_LIST:
            raise ConnectionFault(ErrorCode.ENHANCE_YOUR_CALM, "a header block too large")
        if not last:
            return
        self._block = None
        try:
            # Decoded whatever becomes of the stream: the dynamic table is the connection's.
            fields = self._decoder.decode(b"".join(block.fragments))
        except HpackError as exc:
            raise ConnectionFault(ErrorCode.COMPRESSION_ERROR, f"HPACK: {exc}") from exc
        sid = block.stream_id
        st = self.streams.get(sid)
        if st is not None:  # trailers: a gRPC request has none, but they end it
            if st.received or not block.end_stream:
                raise StreamFault(sid, ErrorCode.PROTOCOL_ERROR, "HEADERS on an open stream")
            st.received = True
            ready.append(st)
            return
        if sid <= self._last_stream:
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, f"stream {sid} reused")
        self._last_stream = sid
        if len(self.streams) >= MAX_STREAMS:
            raise StreamFault(sid, ErrorCode.REFUSED_STREAM, "too many streams")
        st = Stream(sid, dict(fields), self._peer_initial_window)
        self.streams[sid] = st
        if block.end_stream:
            st.received = True
            ready.append(st)

    def _window_update(self, head: FrameHead, payload: bytes) -> None:
        inc = http2.parse_window_update(head, payload)
        if not head.stream_id:
            if not inc:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += inc
            if self._send_window > http2.MAX_WINDOW:
                raise ConnectionFault(ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")
            return
        st = self.streams.get(head.stream_id)
        if not inc:
            raise StreamFault(head.stream_id, ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        if st is not None:
            st.send_window += inc
            if st.send_window > http2.MAX_WINDOW:
                raise StreamFault(st.id, ErrorCode.FLOW_CONTROL_ERROR, "window over 2^31-1")

    def _settings(self, head: FrameHead, payload: bytes) -> None:
        if head.stream_id:
            raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if head.flags & http2.ACK:
            if payload:
                raise ConnectionFault(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        for key, value in http2.parse_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > http2.MAX_WINDOW:
                    raise ConnectionFault(ErrorCode.FLOW_CONTROL_ERROR, "initial window too big")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for st in self.streams.values():
                    st.send_window += delta
            elif key == Setting.MAX_FRAME_SIZE:
                if not http2.DEFAULT_MAX_FRAME <= value <= http2.MAX_FRAME_LIMIT:
                    raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self._out.append(http2.SETTINGS_ACK)

    # -- writing (the calls' threads) ---------------------------------------------------------
    def _flush(self) -> None:
        if not self._out:
            return
        out = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        try:
            self.sock.sendall(out)
        except OSError as exc:
            self.closed = True
            raise Gone from exc

    def _check(self, st: Stream) -> None:
        if self.closed or st.done or st.id not in self.streams:
            raise Gone

    def send(
        self,
        st: Stream,
        data: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        end: list[tuple[bytes, bytes]] | None = None,
        last: bool = False,
    ) -> None:
        """Response headers (once; `last`: they end the stream, a trailers-only answer),
        `data` as the peer's windows allow, then the trailers `end` closing the stream:
        one write to the socket unless a window is full."""
        view = memoryview(data)
        with self.cond:
            self._check(st)
            if headers is not None:
                block = http2.encode_headers(headers)
                self._out.append(http2.headers_frames(st.id, block, last, self._peer_max_frame))
                st.started = True
            while view:
                n = min(self._send_window, st.send_window, self._peer_max_frame, len(view))
                if n <= 0:
                    self._flush()
                    if not self.cond.wait(SEND_STALL_SECONDS):
                        raise Gone
                    self._check(st)
                    continue
                self._out.append(http2.data_frame(st.id, bytes(view[:n])))
                self._send_window -= n
                st.send_window -= n
                view = view[n:]
            if end is not None:
                block = http2.encode_headers(end)
                self._out.append(http2.headers_frames(st.id, block, True, self._peer_max_frame))
            self._flush()

    def forget(self, st: Stream) -> None:
        with self.cond:
            self.streams.pop(st.id, None)
            ended = st.end()
        run_callbacks(ended)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            ended = [fn for st in self.streams.values() for fn in st.end()]
            self.streams.clear()
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        self._closed(self)
        run_callbacks(ended)
