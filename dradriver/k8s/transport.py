"""HTTP(S) to the API server through urllib3, on the pool the official library's
RESTClientObject builds from a Configuration (CA, client certificate, tls-server-name,
proxy), without its re-encoding and without hidden retries (docs/design.md, "The API
client")."""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import urllib3

POOL_SIZE = 32

# What urllib3 would build from retries=False on every request (Retry.from_int): built
# once, it is never changed (a Retry's increment returns a new one).
NO_RETRIES = urllib3.Retry(total=False, redirect=False)

Timeout = float | tuple[float, float]  # total, or (connect, read)


class TransportError(Exception):
    """No HTTP answer (refused, timed out, TLS, a proxy, a broken stream); str() is one
    line."""


class Transport:
    """Thread-safe: urllib3's pool is."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None
        self._host: Any = None  # the server's HTTP(S)ConnectionPool in self._pool
        # scheme://host[:port] of the server: what a request URL starts with.
        scheme, _, rest = str(cfg.host).partition("://")
        self._origin = f"{scheme}://{rest.split('/', 1)[0]}"

    def send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        *,
        body: bytes | None,
        timeout: Timeout,
        repeated: Sequence[tuple[str, str]] = (),
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """The response to one request, with `repeated` headers added (names that may
        come more than once, each sent apart); its body read unless `stream` (then the
        caller reads it, and closes it if it stops early)."""
        pool, target = self._target(url)
        sent: Mapping[str, str] = headers
        if repeated:
            sent = urllib3.HTTPHeaderDict(headers)
            for name, value in repeated:
                sent.add(name, value)
        what = f"{method} {url.split('?', 1)[0]}"
        try:
            resp: urllib3.BaseHTTPResponse = pool.urlopen(
                method,
                target,
                body=body,
                headers=sent,
                timeout=_timeout(timeout),
                retries=NO_RETRIES,
                redirect=False,
                preload_content=not stream,
                assert_same_host=False,
            )
            return resp
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            why = describe(exc)
            cert = self._cfg.cert_file
            if cert and isinstance(exc, urllib3.exceptions.SSLError | OSError):
                why = cert_problem(cert, self._cfg.key_file or cert) or why
            raise TransportError(f"{what}: {why}") from exc

    def reconnect(self) -> None:
        """Drops kept connections (the certificate files were replaced in place): new
        ones load the files again."""
        with self._lock:
            pool, self._host = self._pool, None
        if pool is not None:
            pool.clear()

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._host = self._pool, None, None
        if pool is not None:
            pool.clear()

    def _manager(self) -> urllib3.PoolManager:
        with self._lock:
            if self._pool is None:
                self._pool = self._build()
            return self._pool

    def _target(self, url: str) -> tuple[Any, str]:
        """Where to send `url`: without a proxy, straight to the server's connection
        pool with the path alone (a PoolManager would parse the URL and look the pool
        up again on every request, a sixth of what urllib3 spends on one); through a
        proxy, to the PoolManager that knows how to reach it."""
        manager = self._manager()
        if type(manager) is not urllib3.PoolManager:  # a ProxyManager, SOCKS
            return manager, url
        with self._lock:
            host = self._host
            if host is None or manager is not self._pool:
                host = self._host = manager.connection_from_url(self._cfg.host)
        origin = self._origin
        if not url.startswith(origin):
            return manager, url
        return host, url[len(origin) :] or "/"

    def _build(self) -> urllib3.PoolManager:
        from kubernetes.client.rest import RESTClientObject

        cfg = copy.copy(self._cfg)  # ours to set; the caller's stays as it was
        cfg.connection_pool_maxsize = POOL_SIZE
        cfg.retries = False
        # TCP keepalive as client-go sets it: a watch through an idle proxy or load
        # balancer that dropped it is found out instead of waiting for its timeout.
        cfg.keep_alive = True
        try:
            pool: urllib3.PoolManager = RESTClientObject(cfg).pool_manager
        except (ValueError, AssertionError, ImportError) as exc:  # a proxy URL urllib3 refuses
            raise TransportError(f"{cfg.host}: {describe(exc)}") from exc
        return pool


@functools.lru_cache(maxsize=16)
def _timeout(timeout: Timeout) -> urllib3.Timeout:
    """The urllib3 Timeout for a total or a (connect, read) pair; the same few values
    recur, and a Timeout is never changed by urllib3 (it clones one to start its clock)."""
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


def describe(exc: BaseException) -> str:
    """One line for what went wrong, without the pool's repr urllib3 puts in front."""
    if isinstance(exc, urllib3.exceptions.ProxyError) and exc.original_error is not None:
        return f"through the proxy: {describe(exc.original_error)}"
    args = exc.args
    if (
        isinstance(exc, urllib3.exceptions.ProtocolError)
        and len(args) > 1
        and isinstance(args[1], BaseException)  # ("Connection aborted.", the cause)
    ):
        return f"{str(args[0]).rstrip('.')}: {describe(args[1])}"
    texts = [a for a in args if isinstance(a, str)]
    text = " ".join((texts[-1] if texts else str(exc)).split())
    if text.startswith(_REPRS) and "): " in text:
        text = text.split("): ", 1)[1]
    return text or type(exc).__name__


_REPRS = ("HTTPConnectionPool(", "HTTPSConnectionPool(", "HTTPConnection(", "HTTPSConnection(")


def cert_problem(cert: str, key: str) -> str | None:
    """Why a client certificate cannot be loaded, if it cannot: looked for only after a
    TLS failure, whose own message ("PEM lib") does not say which file is wrong."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        return f"client certificate {cert} (key {key}): {' '.join(str(exc).split())}"
    return None
