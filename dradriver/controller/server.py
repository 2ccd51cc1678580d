"""The HTTP shell: POST /validate (AdmissionReview in, AdmissionReview out), GET /healthz
and /readyz. Over TLS for the API server, plain for the kubelet's probes.

The TLS handshake runs in the connection's own thread, not in accept(): a client that
connects and never speaks would otherwise stall every admission call behind it.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dradriver import logs
from dradriver.controller import admission
from dradriver.httpreply import reply

log = logs.get_logger("controller")

Check = Callable[[], tuple[bool, str]]
# An AdmissionReview holds the object and the old one; etcd caps objects at 1.5 MiB.
MAX_BODY = 8 << 20
HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0


def review(body: bytes, driver: str) -> tuple[int, bytes, str]:
    """One admission call: (HTTP status, body, content type). Logs each refusal per field."""
    try:
        req = admission.parse(body)
    except admission.BadReview as exc:
        log.warning("malformed AdmissionReview", error=str(exc))
        return 400, f"malformed AdmissionReview: {exc}\n".encode(), "text/plain"
    try:
        decision = admission.decide(req, driver)
    except Exception as exc:
        # A bug of ours: say so loudly; the webhook's failurePolicy decides what follows.
        log.error("checking failed", exc=True, kind=req.kind, claim=req.ref, uid=req.uid)
        return 500, f"internal error: {exc}\n".encode(), "text/plain"
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
    ) -> None:
        self.httpd = _HTTPServer((address, port), _Handler)
        self.httpd.app = self
        self.checks, self.ready, self.validate, self.tls = checks, ready, validate, tls
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


class _HTTPServer(ThreadingHTTPServer):
    app: Server
    daemon_threads = True

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.app.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            conn = self.app.tls().wrap_socket(request, server_side=True)
        except OSError as exc:  # ssl.SSLError included
            # Usually a client that does not trust us yet (the caBundle is being patched).
            log.debug("TLS handshake failed", client=client_address[0], error=str(exc))
            return
        try:
            _Handler(conn, client_address, self)
        finally:
            conn.close()

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
        if path in ("/healthz", "/readyz"):
            code, body = self.server.app.health(path)
            self._send(code, body, "application/json")
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
