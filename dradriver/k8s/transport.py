"""HTTP(S) to one API server over the standard library: a thread-safe pool of kept-alive
connections (urllib3 would bring its own import cost for what http.client does).

No hidden retries: a read must not take several times its timeout. The one exception is
a kept-alive connection the server closed while it sat idle: an idempotent request that
failed on it before any response byte is sent again, once, on a fresh connection, since
the server never saw it.
"""

from __future__ import annotations

import http.client
import os
import select
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from dradriver.k8s.config import ClientCert, KubeConfig
from dradriver.k8s.http1 import Reply, request_head

Timeout = float | tuple[float, float]  # total, or (connect, read)

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# A pooled connection used this recently is taken without looking for a close first.
RECENT_SECONDS = 1.0
# Errors of a request on a connection the server had already closed, raised before a
# status line arrived: RemoteDisconnected (no bytes at all), a reset, a broken pipe, TLS
# finding the stream closed under it.
_STALE = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


class TransportError(Exception):
    """No HTTP answer (refused, timed out, TLS, a broken stream); str() is one line."""


class _Conn(http.client.HTTPConnection):
    """One connection, plain or TLS: TLS is set up here rather than by HTTPSConnection so
    that the name checked (tls-server-name) may differ from the host dialled."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        ctx: ssl.SSLContext | None,
        server_name: str | None,
        generation: int,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ctx = ctx
        self._server_name = server_name or host
        self.generation = generation
        self.idle_since = 0.0  # when it was last handed back to the pool

    def connect(self) -> None:
        super().connect()  # TCP, and the CONNECT tunnel when there is a proxy
        if self._ctx is not None:
            self.sock = self._ctx.wrap_socket(self.sock, server_hostname=self._server_name)

    def dropped(self) -> bool:
        """Whether an idle connection was closed by the server (readable means EOF or
        junk: nothing may arrive on an idle HTTP/1.1 connection)."""
        if self.sock is None:
            return True
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True


class Response:
    """A response whose body is read once: read() or lines(); then close() (done by both
    when they reach the end) hands the connection back to the pool."""

    def __init__(self, pool: Pool, conn: _Conn, resp: Reply, what: str) -> None:
        self.status = resp.status
        self.reason = resp.reason
        self.headers = resp.headers
        self._pool, self._conn, self._resp, self._what = pool, conn, resp, what
        self._done = False

    def read(self) -> bytes:
        try:
            data = self._resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self._fail()
            raise TransportError(_describe(self._what, "reading the response", exc)) from exc
        self.close()
        return data

    def lines(self) -> Iterator[bytes]:
        """The body line by line, each as soon as it arrives (a watch stream)."""
        buf = b""
        try:
            while True:
                try:
                    chunk = self._resp.read1(65536)
                except (OSError, http.client.HTTPException) as exc:
                    self._fail()
                    raise TransportError(_describe(self._what, "reading the stream", exc)) from exc
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    yield line
            if buf:
                yield buf
        finally:
            self.close()

    def close(self) -> None:
        """Back to the pool if the body was read to its end, else the connection is closed
        (unread bytes would be taken for the next response)."""
        if self._done:
            return
        self._done = True
        if self._resp.isclosed() and not self._resp.will_close and not self._resp.leftover:
            self._pool._release(self._conn)
        else:
            self._conn.close()

    def _fail(self) -> None:
        self._done = True
        self._conn.close()


class Pool:
    """Connections to one server. Thread-safe: each request holds a connection of its
    own; a new one is opened when every kept one is busy."""

    def __init__(self, cfg: KubeConfig, cert: ClientCert | None, max_idle: int = 16) -> None:
        """`cert`: the client certificate to present (TransportError if it, or the CA,
        cannot be loaded)."""
        url = urlsplit(cfg.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise TransportError(f"server {cfg.server!r} is not an http(s) URL")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.prefix = url.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = f"{host}:{self.port}"
        self._cfg = cfg
        self._proxy: tuple[str, int] | None = None
        if cfg.proxy_url:
            proxy = urlsplit(cfg.proxy_url)
            if proxy.scheme != "http" or not proxy.hostname:
                raise TransportError(f"proxy-url {cfg.proxy_url!r}: only http:// proxies work")
            self._proxy = (proxy.hostname, proxy.port or 80)
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_Conn] = []
        self._generation = 0
        self._cert = cert
        self._ctx = _ssl_context(cfg, cert) if self.https else None

    def use_client_cert(self, cert: ClientCert | None) -> None:
        """Present `cert` from now on (an exec plugin renewed it): kept connections made
        with the old one are dropped."""
        if cert == self._cert or not self.https:
            return
        ctx = _ssl_context(self._cfg, cert)  # outside the lock: requests go on meanwhile
        with self._lock:
            self._cert, self._ctx = cert, ctx
            self._generation += 1
            stale, self._idle = self._idle, []
        for c in stale:
            c.close()

    @property
    def client_cert(self) -> ClientCert | None:
        return self._cert

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: Timeout,
    ) -> Response:
        """Sends `method target` (a path with its query); the Response has its status and
        headers read, and its body waiting."""
        connect_timeout, read_timeout = timeout if isinstance(timeout, tuple) else (timeout, None)
        what = f"{method} {self._cfg.server}{target.split('?', 1)[0]}"
        url = self.prefix + target
        for attempt in (1, 2):
            # The retry takes a new connection: the next idle one may be as stale.
            conn, reused = self._acquire(
                connect_timeout, fresh=attempt == 2, retryable=method in IDEMPOTENT
            )
            try:
                if conn.sock is None:
                    start = time.monotonic()
                    conn.connect()
                    # As urllib3's total timeout: connecting spends from the same budget.
                    if read_timeout is None:
                        read_timeout_now = max(connect_timeout - (time.monotonic() - start), 0.001)
                    else:
                        read_timeout_now = read_timeout
                else:
                    read_timeout_now = connect_timeout if read_timeout is None else read_timeout
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                doing = f"connecting to {self._where()}"
                raise TransportError(_describe(what, doing, exc)) from exc
            try:
                assert conn.sock is not None
                if conn.sock.gettimeout() != read_timeout_now:  # a syscall, mostly the same
                    conn.sock.settimeout(read_timeout_now)
                conn.sock.sendall(
                    request_head(method, url, self._host_header, headers, body) + (body or b"")
                )
                resp = Reply(conn.sock, head_only=method == "HEAD")
            except _STALE as exc:
                conn.close()
                if reused and attempt == 1 and method in IDEMPOTENT:
                    continue
                raise TransportError(_describe(what, "sending the request", exc)) from exc
            except (OSError, http.client.HTTPException, ValueError) as exc:
                conn.close()
                raise TransportError(_describe(what, "waiting for the answer", exc)) from exc
            return Response(self, conn, resp, what)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def _acquire(self, connect_timeout: float, fresh: bool, retryable: bool) -> tuple[_Conn, bool]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle and not fresh else None
                generation, ctx = self._generation, self._ctx
            if conn is None:
                break
            # The look for a close by the server (a select) is skipped for a request that
            # is retried on a stale connection anyway, when the connection was in use
            # within the last second: a server closes connections idle for far longer.
            recent = time.monotonic() - conn.idle_since < RECENT_SECONDS
            if not (retryable and recent) and conn.dropped():
                conn.close()
                continue
            return conn, True
        host, port = self._proxy or (self.host, self.port)
        server_name = self._cfg.tls_server_name or self.host
        conn = _Conn(host, port, connect_timeout, ctx, server_name, generation)
        if self._proxy is not None:
            conn.set_tunnel(self.host, self.port)
        return conn, False

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            if conn.generation == self._generation and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _where(self) -> str:
        where = f"{self.host}:{self.port}"
        if self._proxy is not None:
            where += f" through the proxy {self._proxy[0]}:{self._proxy[1]}"
        return where


def _describe(what: str, doing: str, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        detail = f"timed out ({exc})" if str(exc) not in ("", "timed out") else "timed out"
    elif isinstance(exc, http.client.RemoteDisconnected):
        detail = "the server closed the connection without an answer"
    else:
        detail = " ".join(str(exc).split()) or type(exc).__name__
    return f"{what}: {doing}: {detail}"


def _ssl_context(cfg: KubeConfig, cert: ClientCert | None) -> ssl.SSLContext:
    """The TLS trust (the CA, or the system's, or none with insecure-skip-tls-verify) and
    the client certificate for `cfg`."""
    try:
        return _build_ssl_context(cfg, cert)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise TransportError(f"TLS setup for {cfg.server}: {' '.join(str(exc).split())}") from exc


def _build_ssl_context(cfg: KubeConfig, cert: ClientCert | None) -> ssl.SSLContext:
    if cfg.insecure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_file or cfg.ca_data:
        # The kubeconfig's CA only, as client-go trusts it: not the system's roots too,
        # whose loading (create_default_context) took 50 ms of the plugin's first call.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, cert required
        if cfg.ca_file:
            ctx.load_verify_locations(cafile=cfg.ca_file)
        if cfg.ca_data:
            pem = b"-----BEGIN" in cfg.ca_data
            ctx.load_verify_locations(cadata=cfg.ca_data.decode() if pem else cfg.ca_data)
    else:
        ctx = ssl.create_default_context(cafile=_certifi())
    if cert is not None:
        _load_cert(ctx, cert)
    return ctx


def _certifi() -> str | None:
    """certifi's bundle when installed, as the official client used; else the system's."""
    try:
        import certifi
    except ImportError:
        return None
    return str(certifi.where())


def _load_cert(ctx: ssl.SSLContext, cert: ClientCert) -> None:
    # ssl loads a certificate only from a file: PEM data goes through a private
    # temporary directory that is gone once loaded.
    with tempfile.TemporaryDirectory(prefix="dradriver-cert-") as tmp:
        certfile, keyfile = cert.cert_file, cert.key_file
        if cert.cert_pem is not None:
            certfile = _write_private(os.path.join(tmp, "cert.pem"), cert.cert_pem)
        if cert.key_pem is not None:
            keyfile = _write_private(os.path.join(tmp, "key.pem"), cert.key_pem)
        assert certfile is not None
        ctx.load_cert_chain(certfile, keyfile)


def _write_private(path: str, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path
