"""A gRPC server for the kubelet's sockets: HTTP/2 from the h2 library (the protocol's
state machine, flow control, HPACK), gRPC's framing from framing.py, one Unix socket,
unary and server-streaming methods, no TLS, no compression: what the plugin registration,
DRA and DRA health services need and no more.

Why not grpcio: its C core alone kept 15 MiB of the plugin's 58 MiB resident (10 MiB of
shared-library text, the rest its threads and buffers) for two sockets that carry a few
small calls a second. The kubelet's client is grpc-go; tests call the sockets with
grpcio's client, so both ends of the protocol are the reference implementations.

Threads: one accepts; one per connection reads and feeds h2 (all h2 state is changed
under the connection's condition); calls run on a pool of `workers` threads, a
streaming call holding one for its life, as with grpcio's synchronous server.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from dradriver.kubeletplugin.rpc.framing import (
    FramingError,
    Status,
    frame,
    one_message,
    request_problem,
    response_headers,
    trailers,
    trailers_only,
)
from dradriver.logs import get_logger

log = get_logger("kubeletplugin.rpc")

# A request larger than this is refused (grpc-go's client default maximum is 4 MiB; the
# kubelet's requests are a few hundred bytes per claim).
MAX_MESSAGE = 16 << 20
# A peer that opens no flow-control window for this long has gone: the call ends.
SEND_STALL_SECONDS = 60.0


# h2's header checks and rewrites cost a tenth of a call's CPU here. Ours are constants
# known to be well-formed; a client's are not rewritten, and what this server relies on
# in them (method, content-type, path) it checks itself (framing.request_problem); a
# header that breaks HTTP/2's rules only fails to match.
_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)


@dataclass(frozen=True)
class Method:
    """One RPC: `parse` reads the request message (a protobuf class's FromString), `call`
    answers it (a message), or yields the messages of a server stream."""

    parse: Callable[[bytes], Any]
    call: Callable[[Any, Context], Any]
    streaming: bool = False


class _Gone(Exception):
    """The stream was reset or the connection closed: nobody to answer."""


@dataclass(eq=False)
class _Stream:
    id: int
    headers: dict[bytes, bytes]
    body: bytearray = field(default_factory=bytearray)
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


class Context:
    """What a method sees of its call (the subset of grpc.ServicerContext in use)."""

    def __init__(self, stream: _Stream, server: RpcServer) -> None:
        self._stream, self._server = stream, server

    def is_active(self) -> bool:
        return not self._stream.done and not self._server.stopping

    def add_callback(self, fn: Callable[[], None]) -> None:
        """`fn` runs when the call is over: answered, cancelled, or its connection gone
        (at least once: twice if the call ends while it is being added)."""
        self._stream.callbacks.append(fn)
        if self._stream.done:
            fn()


def _run(callbacks: list[Callable[[], None]]) -> None:
    for fn in callbacks:
        try:
            fn()
        except Exception as exc:  # a callback's bug must not take the connection down
            log.error("RPC callback failed", error=f"{type(exc).__name__}: {exc}")


class _Connection:
    def __init__(self, server: RpcServer, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.cond = threading.Condition()
        self.streams: dict[int, _Stream] = {}
        self.closed = False

    # -- reading (the connection's own thread) ------------------------------------------------
    def run(self) -> None:
        try:
            with self.cond:
                self.h2.initiate_connection()
                self._flush()
            while not self.closed:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                ready, ended = self._receive(data)
                _run(ended)
                for st in ready:
                    self.server._dispatch(self, st)
        except (OSError, _Gone):
            pass
        finally:
            self.close()

    def _receive(self, data: bytes) -> tuple[list[_Stream], list[Callable[[], None]]]:
        ready: list[_Stream] = []
        ended: list[Callable[[], None]] = []
        with self.cond:
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                log.warning("HTTP/2 protocol error from a client; closing", error=str(exc))
                self._flush()  # h2 has queued the GOAWAY
                raise _Gone from exc
            for ev in events:
                if isinstance(ev, h2.events.RequestReceived):
                    self.streams[ev.stream_id] = _Stream(ev.stream_id, dict(ev.headers or []))
                elif isinstance(ev, h2.events.DataReceived):
                    st = self.streams.get(ev.stream_id)
                    if ev.flow_controlled_length:
                        with contextlib.suppress(h2.exceptions.StreamClosedError):
                            self.h2.acknowledge_received_data(
                                ev.flow_controlled_length, ev.stream_id
                            )
                    if st is not None and ev.data:
                        st.body += ev.data
                        if len(st.body) > MAX_MESSAGE + 5:
                            self.h2.reset_stream(ev.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                            ended += self.streams.pop(ev.stream_id).end()
                elif isinstance(ev, h2.events.StreamEnded):
                    st = self.streams.get(ev.stream_id)
                    if st is not None:
                        ready.append(st)
                elif isinstance(ev, h2.events.StreamReset):
                    st = self.streams.pop(ev.stream_id, None)
                    if st is not None:
                        ended += st.end()
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.closed = True
            self._flush()
            self.cond.notify_all()  # window updates, resets: senders look again
        return ready, ended

    # -- writing (the calls' threads) ---------------------------------------------------------
    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out:
            try:
                self.sock.sendall(out)
            except OSError as exc:
                self.closed = True
                raise _Gone from exc

    def _check(self, st: _Stream) -> None:
        if self.closed or st.done or st.id not in self.streams:
            raise _Gone

    def _send(
        self,
        st: _Stream,
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
            try:
                self._check(st)
                if headers is not None:
                    self.h2.send_headers(st.id, headers, end_stream=last)
                    st.started = True
                while view:
                    n = min(
                        self.h2.local_flow_control_window(st.id),
                        self.h2.max_outbound_frame_size,
                        len(view),
                    )
                    if n <= 0:
                        self._flush()
                        if not self.cond.wait(SEND_STALL_SECONDS):
                            raise _Gone
                        self._check(st)
                        continue
                    self.h2.send_data(st.id, bytes(view[:n]))
                    view = view[n:]
                if end is not None:
                    self.h2.send_headers(st.id, end, end_stream=True)
                self._flush()
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
                raise _Gone from exc

    def answer(self, st: _Stream, payload: bytes) -> None:
        self._send(st, frame(payload), response_headers(), trailers(Status.OK))

    def fail(self, st: _Stream, status: Status, message: str) -> None:
        if st.started:
            self._send(st, end=trailers(status, message))
        else:
            self._send(st, headers=trailers_only(status, message), last=True)

    def stream_start(self, st: _Stream) -> None:
        self._send(st, headers=response_headers())

    def stream_send(self, st: _Stream, payload: bytes) -> None:
        self._send(st, frame(payload))

    def stream_end(self, st: _Stream) -> None:
        self._send(st, end=trailers(Status.OK))

    def forget(self, st: _Stream) -> None:
        with self.cond:
            self.streams.pop(st.id, None)
            ended = st.end()
        _run(ended)

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
        self.server._closed(self)
        _run(ended)


def service(module: ModuleType, name: str, impl: Any) -> dict[str, Method]:
    """The methods of service `name` in the generated module `module`, served by the
    attributes of `impl` named like them: paths and message types come from the proto
    descriptor, so they cannot drift from the .proto files."""
    desc = module.DESCRIPTOR.services_by_name[name]
    return {
        f"/{desc.full_name}/{m.name}": Method(
            parse=getattr(module, m.input_type.name).FromString,
            call=getattr(impl, m.name),
            streaming=m.server_streaming,
        )
        for m in desc.methods
    }


class RpcServer:
    """Serves `methods` (by path: "/package.Service/Method") on `listener`, a listening
    Unix socket (listener.bind_unix), which it closes at stop."""

    def __init__(
        self, methods: dict[str, Method], workers: int, name: str, listener: socket.socket
    ) -> None:
        self.methods, self.name = methods, name
        # Calls wait here for a worker; workers start as calls need them, up to
        # `workers` (a queue and idle threads: half the handoff of an executor's futures).
        self._work: queue.SimpleQueue[tuple[_Connection, _Stream] | None] = queue.SimpleQueue()
        self._workers, self._started, self._idle, self._queued = workers, 0, 0, 0
        self.stopping = False
        self._listener: socket.socket | None = listener
        self._conns: set[_Connection] = set()
        self._lock = threading.Condition()
        self._calls = 0

    def start(self) -> None:
        threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True).start()

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self.stopping:
            try:
                sock, _ = listener.accept()
            except OSError as exc:
                if self.stopping:
                    break  # shut down by stop()
                # Out of file descriptors, most likely: keep the socket, try again.
                log.error(
                    "accepting a connection failed; retrying", server=self.name, error=str(exc)
                )
                time.sleep(0.1)
                continue
            conn = _Connection(self, sock)
            with self._lock:
                if self.stopping:
                    sock.close()
                    break
                self._conns.add(conn)
            threading.Thread(target=conn.run, name=f"{self.name}-conn", daemon=True).start()

    def _closed(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)
            self._lock.notify_all()

    def _dispatch(self, conn: _Connection, st: _Stream) -> None:
        with self._lock:
            self._calls += 1
            self._queued += 1
            more = self._queued > self._idle and self._started < self._workers
            if more:
                self._started += 1
                self._idle += 1
        if more:
            threading.Thread(target=self._worker, name=f"{self.name}-worker", daemon=True).start()
        self._work.put((conn, st))

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            try:
                self._serve(*item)
            finally:
                with self._lock:
                    self._idle += 1

    def _call_done(self) -> None:
        with self._lock:
            self._calls -= 1
            if self._calls == 0:
                self._lock.notify_all()

    def _serve(self, conn: _Connection, st: _Stream) -> None:
        path = st.headers.get(b":path", b"").decode(errors="replace")
        try:
            problem = request_problem(st.headers)
            method = self.methods.get(path)
            if problem:
                conn.fail(st, Status.INTERNAL, f"not a gRPC request: {problem}")
            elif method is None:
                conn.fail(st, Status.UNIMPLEMENTED, f"unknown method {path}")
            elif self.stopping:
                conn.fail(st, Status.UNAVAILABLE, "the server is stopping")
            else:
                self._call(conn, st, method, path)
        except _Gone:
            pass
        finally:
            conn.forget(st)
            self._call_done()

    def _call(self, conn: _Connection, st: _Stream, method: Method, path: str) -> None:
        try:
            request = method.parse(one_message(bytes(st.body), MAX_MESSAGE))
        except FramingError as exc:
            conn.fail(st, exc.status, str(exc))
            return
        except Exception as exc:  # protobuf's DecodeError, from whichever backend
            conn.fail(st, Status.INTERNAL, f"could not parse the request: {exc}")
            return
        ctx = Context(st, self)
        try:
            if not method.streaming:
                conn.answer(st, method.call(request, ctx).SerializeToString())
                return
            conn.stream_start(st)
            replies: Iterator[Any] = method.call(request, ctx)
            try:
                for reply in replies:
                    conn.stream_send(st, reply.SerializeToString())
            finally:
                close = getattr(replies, "close", None)
                if close is not None:
                    close()
            conn.stream_end(st)
        except _Gone:
            raise
        except Exception as exc:
            log.error("RPC failed", method=path, error=f"{type(exc).__name__}: {exc}", exc=True)
            conn.fail(st, Status.UNKNOWN, f"Exception calling application: {exc}")

    def stop(self, grace: float | None) -> threading.Event:
        """Stops taking calls; those under way get `grace` seconds (None: none), then
        every connection is closed. The returned event is set when that is done. The
        socket file is left to the caller."""
        done = threading.Event()
        with self._lock:
            if self.stopping:
                done.set()
                return done
            self.stopping = True
        # No GOAWAY: h2 sends nothing more once it has sent one, answers under way
        # included. New calls on open connections are answered UNAVAILABLE instead
        # (`stopping`), which clients retry, as they would after a GOAWAY.
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self._listener.close()

        def finish() -> None:
            with self._lock:
                self._lock.wait_for(lambda: self._calls == 0, timeout=grace or 0)
                left = list(self._conns)
            for conn in left:
                conn.close()
            for _ in range(self._started):
                self._work.put(None)
            done.set()

        threading.Thread(target=finish, name=f"{self.name}-stop", daemon=True).start()
        return done
