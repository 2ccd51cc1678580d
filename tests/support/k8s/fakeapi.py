"""A stand-in API server for the client's tests: stdlib http.server over TLS (or plain
HTTP) in a thread, HTTP/1.1 keep-alive, with a few routes that misbehave on purpose."""

from __future__ import annotations

import json
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.k8s.certs import TestCA


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    conn: tuple[str, int]  # the client's address: one per TCP connection
    client_cn: str | None
    body: bytes


class FakeAPI:
    def __init__(self, tmp: Path, tls: bool = True, client_ca: TestCA | None = None) -> None:
        self.ca = TestCA("fake API CA")
        self.ca_file = tmp / "ca.crt"
        self.ca_file.write_bytes(self.ca.pem)
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.watch_events: list[dict[str, Any]] = []
        self.watch_gate = threading.Event()  # the rest of the events wait for it
        self.slow = 2.0
        self.flaky_hits = 0
        # /busy answers 429 this many times (with this Retry-After, if any), then 200.
        self.busy = 0
        self.retry_after: str | None = "0"
        # Credentials answered 401: Authorization headers, and client certificate CNs.
        self.deny: set[str] = set()
        self.git_version = "v1.34.4"  # what /version says
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are written apart

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self)

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        class Server(ThreadingHTTPServer):
            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)
                api.closed.set()

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that hang up or fail TLS on purpose: not the test's news

        self.closed = threading.Event()  # the server closed a connection
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls:
            pair = self.ca.issue("fake API", server=True, names=("127.0.0.1", "localhost"))
            cert, key = pair.write(tmp, "server")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            if client_ca is not None:
                ctx.verify_mode = ssl.CERT_OPTIONAL
                ctx.load_verify_locations(cadata=client_ca.pem.decode())
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.watch_gate.set()
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        with self.lock:
            return [s.path for s in self.seen]

    def connections(self) -> set[tuple[str, int]]:
        """The client addresses seen: one per TCP connection."""
        with self.lock:
            return {s.conn for s in self.seen}

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        cn = None
        peer = h.connection.getpeercert() if isinstance(h.connection, ssl.SSLSocket) else None
        if peer:
            cn = dict(x[0] for x in peer["subject"])["commonName"]
        seen = Seen(h.command, h.path, dict(h.headers.items()), h.client_address, cn, body)
        with self.lock:
            self.seen.append(seen)
        route = h.path.split("?", 1)[0]
        if h.headers.get("authorization") in self.deny or (cn is not None and cn in self.deny):
            msg = "Unauthorized"
            return _json(h, 401, {"kind": "Status", "reason": "Unauthorized", "message": msg})
        if route == "/busy":
            with self.lock:
                busy, self.busy = self.busy > 0, max(self.busy - 1, 0)
            if busy:
                extra = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
                body = {"kind": "Status", "reason": "TooManyRequests", "message": "slow down"}
                return _json(h, 429, body, extra)
            return _json(h, 200, {"ok": True})
        if route == "/flaky":
            with self.lock:
                self.flaky_hits += 1
                first = self.flaky_hits == 1
            if first:  # as a server whose idle timeout struck: closed, no answer
                h.close_connection = True
                return
            return _json(h, 200, {"hits": self.flaky_hits})
        if route == "/missing":
            msg = 'widgets "x" not found'
            return _json(h, 404, {"kind": "Status", "reason": "NotFound", "message": msg})
        if route == "/conflict":
            msg = "the object has been modified"
            return _json(h, 409, {"kind": "Status", "reason": "Conflict", "message": msg})
        if route == "/forbidden":
            return _raw(h, 403, b"<html>no</html>", "text/html")
        if route == "/slow":
            time.sleep(self.slow)
            return _json(h, 200, {})
        if route == "/empty":
            return _raw(h, 200, b"", "application/json")
        if route == "/metrics":
            return _raw(h, 200, b"up 1\n", "text/plain")
        if route == "/idle-close":
            _json(h, 200, {"ok": True})
            h.close_connection = True  # without saying so: the client finds out later
            return None
        if route == "/watch":
            return self._watch(h)
        return _json(
            h,
            200,
            {
                "method": h.command,
                "path": h.path,
                "auth": h.headers.get("authorization"),
                "impersonate": [
                    [k, v] for k, v in h.headers.items() if k.lower().startswith("impersonate-")
                ],
                "contentType": h.headers.get("Content-Type"),
                "cn": cn,
                "body": body.decode(),
                # What an API server's /version says (and any other path, here).
                "gitVersion": self.git_version,
            },
        )

    def _watch(self, h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i, ev in enumerate(self.watch_events):
            if i == 1:
                self.watch_gate.wait(10)
            data = json.dumps(ev).encode() + b"\n"
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()


def _json(
    h: BaseHTTPRequestHandler, status: int, obj: Any, headers: dict[str, str] | None = None
) -> None:
    _raw(h, status, json.dumps(obj).encode(), "application/json", headers)


def _raw(
    h: BaseHTTPRequestHandler,
    status: int,
    data: bytes,
    ctype: str,
    headers: dict[str, str] | None = None,
) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)
    h.wfile.flush()
