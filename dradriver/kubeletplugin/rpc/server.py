"""A gRPC server for the kubelet's sockets: HTTP/2 from connection.py, gRPC's framing
from framing.py, one Unix socket, unary and server-streaming methods, no TLS, no
compression: what the plugin registration, DRA and DRA health services need and no more.

Why not grpcio: its C core alone kept 15 MiB of the plugin's 58 MiB resident (10 MiB of
shared-library text, the rest its threads and buffers) for two sockets that carry a few
small calls a second. The kubelet's client is grpc-go; tests call the sockets with
grpcio's client, so both ends of the protocol are the reference implementations.

Threads: one accepts; one per connection reads (connection.Connection.run); calls run on
a pool of `workers` threads, a streaming call holding one for its life, as with grpcio's
synchronous server.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dradriver.kubeletplugin.rpc.connection import Connection, Gone, Stream
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


@dataclass(frozen=True)
class Method:
    """One RPC: `parse` reads the request message (a protobuf class's FromString), `call`
    answers it (a message), or yields the messages of a server stream."""

    parse: Callable[[bytes], Any]
    call: Callable[[Any, Context], Any]
    streaming: bool = False


class Context:
    """What a method sees of its call (the subset of grpc.ServicerContext in use)."""

    def __init__(self, stream: Stream, server: RpcServer) -> None:
        self._stream, self._server = stream, server

    def is_active(self) -> bool:
        return not self._stream.done and not self._server.stopping

    def add_callback(self, fn: Callable[[], None]) -> None:
        """`fn` runs when the call is over: answered, cancelled, or its connection gone
        (at least once: twice if the call ends while it is being added)."""
        self._stream.callbacks.append(fn)
        if self._stream.done:
            fn()


def _answer(conn: Connection, st: Stream, payload: bytes) -> None:
    conn.send(st, frame(payload), response_headers(), trailers(Status.OK))


def _fail(conn: Connection, st: Stream, status: Status, message: str) -> None:
    if st.started:
        conn.send(st, end=trailers(status, message))
    else:
        conn.send(st, headers=trailers_only(status, message), last=True)


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
        self._work: queue.SimpleQueue[tuple[Connection, Stream] | None] = queue.SimpleQueue()
        self._workers, self._started, self._idle, self._queued = workers, 0, 0, 0
        self.stopping = False
        self._listener: socket.socket | None = listener
        self._conns: set[Connection] = set()
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
            conn = Connection(sock, self._dispatch, self._closed, MAX_MESSAGE + 5)
            with self._lock:
                if self.stopping:
                    sock.close()
                    break
                self._conns.add(conn)
            threading.Thread(target=conn.run, name=f"{self.name}-conn", daemon=True).start()

    def _closed(self, conn: Connection) -> None:
        with self._lock:
            self._conns.discard(conn)
            self._lock.notify_all()

    def _dispatch(self, conn: Connection, st: Stream) -> None:
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

    def _serve(self, conn: Connection, st: Stream) -> None:
        path = st.headers.get(b":path", b"").decode(errors="replace")
        try:
            problem = request_problem(st.headers)
            method = self.methods.get(path)
            if problem:
                _fail(conn, st, Status.INTERNAL, f"not a gRPC request: {problem}")
            elif method is None:
                _fail(conn, st, Status.UNIMPLEMENTED, f"unknown method {path}")
            elif self.stopping:
                _fail(conn, st, Status.UNAVAILABLE, "the server is stopping")
            else:
                self._call(conn, st, method, path)
        except Gone:
            pass
        finally:
            conn.forget(st)
            self._call_done()

    def _call(self, conn: Connection, st: Stream, method: Method, path: str) -> None:
        try:
            request = method.parse(one_message(bytes(st.body), MAX_MESSAGE))
        except FramingError as exc:
            _fail(conn, st, exc.status, str(exc))
            return
        except Exception as exc:  # protobuf's DecodeError, from whichever backend
            _fail(conn, st, Status.INTERNAL, f"could not parse the request: {exc}")
            return
        ctx = Context(st, self)
        try:
            if not method.streaming:
                _answer(conn, st, method.call(request, ctx).SerializeToString())
                return
            conn.send(st, headers=response_headers())
            replies: Iterator[Any] = method.call(request, ctx)
            try:
                for reply in replies:
                    conn.send(st, frame(reply.SerializeToString()))
            finally:
                close = getattr(replies, "close", None)
                if close is not None:
                    close()
            conn.send(st, end=trailers(Status.OK))
        except Gone:
            raise
        except Exception as exc:
            log.error("RPC failed", method=path, error=f"{type(exc).__name__}: {exc}", exc=True)
            _fail(conn, st, Status.UNKNOWN, f"Exception calling application: {exc}")

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
        # New calls on open connections are answered UNAVAILABLE (`stopping`), which
        # clients retry, as they would after a GOAWAY.
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
