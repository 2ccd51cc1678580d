"""HTTP(S) to the API server through urllib3, on the pool the official library's
RESTClientObject builds from a Configuration (CA, client certificate, tls-server-name,
proxy), without its re-encoding and without hidden retries (docs/design.md, "The API
client")."""

from __future__ import annotations

import copy
import functools
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import urllib3

from dradriver.k8s.errors import KubeError

POOL_SIZE = 32

# What urllib3 would build from retries=False on every request (Retry.from_int): built
# once, it is never changed (a Retry's increment returns a new one).
NO_RETRIES = urllib3.Retry(total=False, redirect=False)

Timeout = float | tuple[float, float]  # total, or (connect, read)


class Transport:
    """Thread-safe: urllib3's pool is."""

    def __init__(self, cfg: Any, repeated: Sequence[tuple[str, str]] = ()) -> None:
        """`repeated`: headers added to every request, whose names may come more than
        once (each is sent apart)."""
        self._cfg, self._repeated = cfg, repeated
        self._base = str(cfg.host).rstrip("/")
        self._lock = threading.Lock()
        # (the PoolManager, where requests go, what their target starts with); None
        # until the first request and after close().
        self._pool: tuple[urllib3.PoolManager, Any, str] | None = None

    def send(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        *,
        body: bytes | None,
        timeout: Timeout,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """The response to one request for `path` (with its query) under the server's
        URL; its body read unless `stream` (then the caller reads it, and closes it if it
        stops early)."""
        _, pool, prefix = self._pool or self._connect()
        if self._repeated:
            headers = urllib3.HTTPHeaderDict(headers)
            headers.extend(self._repeated)
        try:
            resp: urllib3.BaseHTTPResponse = pool.urlopen(
                method,
                prefix + path,
                body=body,
                headers=headers,
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
            where = f"{method} {self._base}{path.split('?', 1)[0]}"
            raise KubeError(0, "Unreachable", f"{where}: {why}") from exc

    def close(self) -> None:
        """Drops kept connections; the next request connects again (loading the client
        certificate files again: they may have been replaced in place)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool[0].clear()

    def _connect(self) -> tuple[urllib3.PoolManager, Any, str]:
        from kubernetes.client.rest import RESTClientObject

        with self._lock:
            if self._pool is not None:
                return self._pool
            cfg = copy.copy(self._cfg)  # ours to set; the caller's stays as it was
            cfg.connection_pool_maxsize = POOL_SIZE
            cfg.retries = False
            # TCP keepalive as client-go sets it: a watch through an idle proxy or load
            # balancer that dropped it is found out instead of waiting for its timeout.
            cfg.keep_alive = True
            try:
                manager: urllib3.PoolManager = RESTClientObject(cfg).pool_manager
            except (ValueError, AssertionError, ImportError) as exc:  # a proxy URL it refuses
                raise KubeError(0, "Unreachable", f"{cfg.host}: {describe(exc)}") from exc
            if type(manager) is urllib3.PoolManager:
                # No proxy: straight to the server's connection pool with the path alone
                # (the manager would parse the URL and look the pool up on every request).
                prefix = "".join(self._base.partition("://")[2].partition("/")[1:])
                self._pool = (manager, manager.connection_from_url(self._base), prefix)
            else:  # a ProxyManager, SOCKS: the whole URL, for it to reach the server
                self._pool = (manager, manager, self._base)
            return self._pool


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
    cause = args[1] if isinstance(exc, urllib3.exceptions.ProtocolError) and len(args) > 1 else None
    if isinstance(cause, BaseException):  # ("Connection aborted.", the cause)
        return f"{str(args[0]).rstrip('.')}: {describe(cause)}"
    texts = [a for a in args if isinstance(a, str)]
    text = " ".join((texts[-1] if texts else str(exc)).split())
    text = re.sub(r"^HTTPS?Connection(Pool)?\(.*?\): ", "", text)  # urllib3's repr first
    return text or type(exc).__name__


def cert_problem(cert: str, key: str) -> str | None:
    """Why a client certificate cannot be loaded, if it cannot: looked for only after a
    TLS failure, whose own message ("PEM lib") does not say which file is wrong."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        return f"client certificate {cert} (key {key}): {' '.join(str(exc).split())}"
    return None
