"""The HTTP shell: POST /validate (AdmissionReview in, AdmissionReview out), GET /healthz
and /readyz. Over TLS for the API server, plain for the kubelet's probes.

The TLS handshake runs in the connection's own thread, not in accept(): a client that
connects and never speaks would otherwise stall every admission call behind it. Those
threads are bounded (MAX_CONNECTIONS), and each connection has a deadline from accept to
close (CONNECTION_DEADLINE), so peers that connect and trickle hold a slot only that
long: the accepting thread shuts down any connection past it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dradriver import logs
from dradriver.controller import admission
from dradriver.httpreply import reply

log = logs.get_logger("controller")

Check = Callable[[], tuple[bool, str]]
# A read-only page served on GET (/metrics): its body and content type.
Page = Callable[[], tuple[bytes, str]]
# An AdmissionReview holds the object and the old one; etcd caps objects at 1.5 MiB.
MAX_BODY = 8 << 20
HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
# Connections served at once, a thread each. The API server makes one call per claim or
# template write, answered in milliseconds, so 16 at once is past a burst of hundreds of
# writes a second; and 16 bodies of MAX_BODY (128 MiB) leave room in the chart's 256Mi.
MAX_CONNECTIONS = 16
# From accept to close, whatever the peer sends meanwhile: the API server gives up on a
# webhook after its timeoutSeconds, at most 30, so no call it still waits for is cut.
CONNECTION_DEADLINE = 30.0
# How long a connection accepted while every slot is busy waits for one before it is
# closed unanswered; later ones wait in the listen queue meanwhile.
SLOT_WAIT = 1.0
# Refusals are counted and logged at most this often: a flood must not flood the log.
REFUSAL_LOG_PERIOD = 10.0
# The 500's body: the exception's text may hold anything (a token, an object's content),
# and it goes to whoever called; the log has it in full.
INTERNAL_ERROR = b"internal error; see the controller's log\n"


def review(body: bytes, driver: str) -> tuple[int, bytes, str]:
    """One admission call: (HTTP status, body, content type). Logs each refusal per field."""
    try:
        req = admission.parse(body)
    except admission.BadReview as exc:
        log.warning("malformed AdmissionReview", error=str(exc))
        return 400, f"malformed AdmissionReview: {exc}\n".encode(), "text/plain"
    try:
        decision = admission.decide(req, driver)
    except Exception:
        # A bug of ours: say so loudly; the webhook's failurePolicy decides what follows.
        log.error(
            "checking failed",
            exc=True,
            kind=req.kind,
            claim=req.ref,
            operation=req.operation,
            uid=req.uid,
        )
        return 500, INTERNAL_ERROR, "text/plain"
    fields = {"kind": req.kind, "claim": req.ref, "operation": req.operation, "uid": req.uid}
    if decision.unchecked:
        log.debug("admitted unchecked", reason=decision.unchecked, **fields)
    elif decision.allowed:
        log.info("admitted", **fields)
    for p in decision.problems:
        log.info("refused", field=p.field, problem=p.message, **fields)
    out = json.dumps(admission.response(req, decision)).encode()
    return 200, out, "application/json"


class Server:
    """One listening socket. `tls` returns the SSLContext for the next connection (None:
    plain HTTP); `validate` is None where /validate is not served."""

    def __init__(
        self,
        address: str,
        port: int,
        *,
        checks: dict[str, Check],
        ready: dict[str, Check],
        validate: Callable[[bytes], tuple[int, bytes, str]] | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
        name: str = "http",
        max_connections: int = MAX_CONNECTIONS,
        deadline: float = CONNECTION_DEADLINE,
        pages: Mapping[str, Page] | None = None,
    ) -> None:
        self.httpd = _HTTPServer((address, port), _Handler)
        self.httpd.app = self
        self.httpd.limit(max_connections, deadline)
        self.checks, self.ready, self.validate, self.tls = checks, ready, validate, tls
        self.pages = dict(pages or {})
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.1,), name=name, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def health(self, path: str) -> tuple[int, bytes]:
        checks = self.checks if path == "/healthz" else {**self.checks, **self.ready}
        results = {name: check() for name, check in checks.items()}
        ok = all(r[0] for r in results.values())
        doc = {name: {"ok": r[0], "detail": r[1]} for name, r in results.items()}
        return 200 if ok else 503, json.dumps(doc, indent=1).encode() + b"\n"


@dataclasses.dataclass(frozen=True)
class _Open:
    """A connection being served: the socket to shut down at its deadline (the TLS one
    once wrapped, which takes the accepted socket's descriptor over)."""

    sock: socket.socket
    client: str
    deadline: float


class _HTTPServer(ThreadingHTTPServer):
    app: Server
    daemon_threads = True
    # Connections past the busy slots wait here, in the kernel, not in threads.
    request_queue_size = 128

    def limit(self, max_connections: int, deadline: float) -> None:
        self._max, self._deadline = max_connections, deadline
        self._slots = threading.BoundedSemaphore(max_connections)
        # Guards _open, and every shutdown and close of its sockets: a descriptor shut
        # down after its close could be another connection's by then. Keyed by the
        # accepted socket's id, which lives until the connection is closed.
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._refused = 0
        self._refusal_logged = -REFUSAL_LOG_PERIOD

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot():
            self._refuse(request, client_address)
            return
        opened = _Open(request, str(client_address[0]), time.monotonic() + self._deadline)
        with self._lock:
            self._open[id(request)] = opened
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: the caller closes the socket
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _take_slot(self) -> bool:
        """Waits up to SLOT_WAIT for a free slot, freeing those past their deadline."""
        end = time.monotonic() + SLOT_WAIT
        while not self._slots.acquire(timeout=0.05):
            self.service_actions()
            if time.monotonic() >= end:
                return False
        return True

    def _refuse(self, request: Any, client_address: Any) -> None:
        self.shutdown_request(request)
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_PERIOD:
            log.warning(
                "every connection slot busy: connections closed unanswered",
                refused=self._refused,
                slots=self._max,
                client=str(client_address[0]),
            )
            self._refused, self._refusal_logged = 0, now

    def service_actions(self) -> None:
        """Called by serve_forever between polls."""
        self._cut(time.monotonic())

    def _cut(self, now: float) -> None:
        """Shuts down the connections past their deadline at `now`, so the thread serving
        each sees its peer gone and ends."""
        with self._lock:
            late = [key for key, c in self._open.items() if now >= c.deadline]
            for key in late:
                c = self._open.pop(key)
                # socket.socket's, not SSLSocket's: that one also drops the TLS state the
                # serving thread may be reading through.
                with contextlib.suppress(OSError):  # the peer is gone already
                    socket.socket.shutdown(c.sock, socket.SHUT_RDWR)
                log.debug("connection shut down at its deadline", client=c.client)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.pop(id(request), None)
            super().shutdown_request(request)

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls = self.app.tls
        if tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            conn = self._wrap(request, tls())
        except OSError as exc:  # ssl.SSLError included
            log.debug("TLS setup failed", client=client_address[0], error=str(exc))
            return
        try:
            try:
                conn.do_handshake()
            except OSError as exc:
                # Usually a client that does not trust us yet (the caBundle is being
                # patched), or one past its deadline.
                log.debug("TLS handshake failed", client=client_address[0], error=str(exc))
                return
            _Handler(conn, client_address, self)
        finally:
            with self._lock:
                self._open.pop(id(request), None)
                conn.close()

    def _wrap(self, request: socket.socket, context: ssl.SSLContext) -> ssl.SSLSocket:
        """The TLS socket over `request`, before its handshake, and from now on the one
        the deadline shuts down: it takes the descriptor over."""
        with self._lock:
            conn = context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            opened = self._open.get(id(request))
            if opened is not None:
                self._open[id(request)] = dataclasses.replace(opened, sock=conn)
        return conn

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection failed", client=str(client_address), exc=True)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    timeout = IDLE_TIMEOUT
    # HTTP/1.0: one request per connection, so neither side ever reuses a connection
    # the other has just closed; a handshake per admission call is cheap with P-256.
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        page = self.server.app.pages.get(path)
        if path in ("/healthz", "/readyz"):
            code, body = self.server.app.health(path)
            self._send(code, body, "application/json")
        elif page is not None:
            body, ctype = page()
            self._send(200, body, ctype)
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._send(411, b"Content-Length required\n", "text/plain")
            return
        if not 0 <= length <= MAX_BODY:
            self._send(413, f"body over {MAX_BODY} bytes\n".encode(), "text/plain")
            return
        # Read before answering even a 404: closing with unread bytes resets the
        # connection, and the client may lose the answer.
        try:
            body = self.rfile.read(length)
        except OSError:
            return
        validate = self.server.app.validate
        # The API server calls /validate?timeout=10s.
        if validate is None or self.path.split("?", 1)[0] != "/validate":
            self._send(404, b"not found\n", "text/plain")
            return
        code, out, ctype = validate(body)
        self._send(code, out, ctype)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        reply(self, code, body, ctype=ctype)

    def log_message(self, format: str, *args: object) -> None:
        pass  # probes every few seconds would drown the admission log
