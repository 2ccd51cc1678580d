"""A thin JSON client for the Kubernetes API.

The official client's typed models drop fields they do not know and choke on alpha
fields (consumesCounters, binding conditions), and a DRA driver lives on exactly those;
importing it also costs ~400 ms and ~32 MiB, more than the kubelet plugin may spend
starting. So we exchange plain dicts, as the API server itself does, over our own
config loading (config.py), credentials (auth.py) and connection pool (transport.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from dradriver.api import depth
from dradriver.k8s import config as kubeconfig
from dradriver.k8s.auth import Credentials
from dradriver.k8s.config import ClientCert, KubeConfig
from dradriver.k8s.errors import (
    Conflict,
    CredentialError,
    KubeError,
    NotFound,
    error_from_response,
)

if TYPE_CHECKING:
    from dradriver.k8s.transport import Pool, Response

__all__ = ["Conflict", "Kube", "KubeError", "NotFound", "Obj", "path_for"]

Obj = dict[str, Any]
USER_AGENT = "dradriver"


def path_for(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object.

    ("v1", "pods", "ns", "p") -> /api/v1/namespaces/ns/pods/p
    """
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [base]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


class Kube:
    """Plain-dict access to the API server. Thread-safe: the underlying pool is."""

    def __init__(self, config: KubeConfig | Any, default_timeout: float = 30.0) -> None:
        """`config`: a KubeConfig, or an official `kubernetes.client.ApiClient` (read once:
        its server, TLS settings and credentials hook)."""
        if not isinstance(config, KubeConfig):
            from dradriver.k8s.legacy import from_official

            config = from_official(config.configuration)
        self._config = config
        self._timeout = default_timeout
        self._creds = Credentials(config)
        # Made at the first request: ssl and http.client are not imported before.
        self._pool: Pool | None = None
        self._pool_lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> Kube:
        """Loads `path`, or the in-cluster config when `path` is None and we run in a pod,
        or the default kubeconfig otherwise. Raises kubeconfig.ConfigError (one line)."""
        return cls(kubeconfig.load(path))

    def with_token(self, token: str) -> Kube:
        """The same server and trust, authenticated as someone else (a ServiceAccount token):
        no client certificate, nothing that could put the kubeconfig's credentials back."""
        return Kube(self._config.with_token(token), self._timeout)

    @property
    def host(self) -> str:
        return self._config.server

    def close(self) -> None:
        with self._pool_lock:
            pool = self._pool
        if pool is not None:
            pool.close()

    def _pool_for(self, cert: ClientCert | None) -> Pool:
        with self._pool_lock:
            if self._pool is None:
                from dradriver.k8s.transport import Pool

                self._pool = Pool(self._config, cert)
            pool = self._pool
        pool.use_client_cert(cert)  # an exec plugin may have renewed it
        return pool

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
    ) -> Response:
        from dradriver.k8s.transport import TransportError

        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": USER_AGENT,
        }
        target = path + _query(query)
        # Encoded here, compactly: the API server keeps opaque config parameters byte for
        # byte, and a later PATCH (which re-encodes them compactly) must not look like a
        # change to an immutable field.
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        t = timeout if timeout is not None else self._timeout
        try:
            authorization, cert = self._creds.current()
            if authorization is not None:
                headers["authorization"] = authorization
            # No hidden retries: a read must not take a multiple of its timeout. Callers
            # that want retries loop themselves, on their clock.
            resp = self._pool_for(cert).request(method, target, headers, data, t)
        except CredentialError as exc:
            raise KubeError(0, "NoCredentials", str(exc)) from exc
        except TransportError as exc:
            raise KubeError(0, "Unreachable", str(exc)) from exc
        if not 200 <= resp.status < 300:
            if resp.status == 401:
                self._creds.unauthorized()
            raise error_from_response(resp.status, str(resp.reason or ""), _body(resp))
        return resp

    def _data(self, method: str, path: str, **kwargs: Any) -> bytes:
        return _body(self._call(method, path, **kwargs))

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        data = self._data(method, path, **kwargs)
        return cast(Obj, depth.loads(data)) if data else {}

    def text(self, path: str, timeout: float | None = None) -> str:
        """A non-JSON endpoint (the API server's /metrics)."""
        return self._data("GET", path, timeout=timeout).decode(errors="replace")

    def get(self, path: str, timeout: float | None = None, **query: Any) -> Obj:
        return self.request("GET", path, query=query, timeout=timeout)

    def list(self, path: str, **query: Any) -> Obj:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, patch_type: str = "merge") -> Obj:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[patch_type]
        return self.request("PATCH", path, body=body, content_type=content_type)

    def apply(self, path: str, body: Obj, field_manager: str, force: bool = True) -> Obj:
        """Server-side apply: the server merges and tracks ownership per field manager."""
        return self.request(
            "PATCH",
            path,
            body=body,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": field_manager, "force": "true" if force else None},
        )

    def delete(
        self,
        path: str,
        *,
        grace_period: int | None = None,
        missing_ok: bool = False,
        uid: str | None = None,
        **query: Any,
    ) -> Obj:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            return self.request("DELETE", path, body=body, query=query)
        except NotFound:
            if missing_ok:
                return {}
            raise

    def delete_collection(self, path: str, **query: Any) -> Obj:
        return self.request("DELETE", path, query=query)

    def watch(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        timeout_seconds: int = 60,
        **query: Any,
    ) -> Iterator[Obj]:
        """Yields watch events ({"type", "object"}) until the server closes the stream.

        An ERROR event (for example 410 Gone on a too-old resourceVersion) is raised as
        KubeError so callers re-list instead of silently missing changes."""
        q = dict(query)
        q.update(
            watch="true",
            timeoutSeconds=timeout_seconds,
            allowWatchBookmarks="true",
            resourceVersion=resource_version,
        )
        resp = self._call("GET", path, query=q, timeout=(10.0, timeout_seconds + 10.0))
        from dradriver.k8s.transport import TransportError

        try:
            for line in resp.lines():
                if not line.strip():
                    continue
                event = cast(Obj, json.loads(line))
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise KubeError(
                        int(status.get("code", 0)),
                        str(status.get("reason", "")),
                        str(status.get("message", "")),
                    )
                yield event
        except TransportError as exc:  # the stream broke or went silent past its timeout
            raise KubeError(0, "Unreachable", str(exc)) from exc
        finally:
            resp.close()


def _body(resp: Response) -> bytes:
    from dradriver.k8s.transport import TransportError

    try:
        return resp.read()
    except TransportError as exc:
        raise KubeError(0, "Unreachable", str(exc)) from exc


def _query(query: dict[str, Any] | None) -> str:
    """The query string as the official client encoded it ("?k=v&..."): None dropped,
    booleans lowercase, dicts as JSON, values percent-quoted ("/" kept), keys as given."""
    parts = []
    for k, v in (query or {}).items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, dict):
            v = json.dumps(v)
        parts.append(f"{k}={quote(str(v))}")
    return "?" + "&".join(parts) if parts else ""
