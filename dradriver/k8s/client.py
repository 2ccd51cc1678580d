"""A thin JSON client for the Kubernetes API.

The official client's typed models drop fields they do not know and choke on alpha
fields (consumesCounters, binding conditions), and a DRA driver lives on exactly those.
So we keep the official library for what it does well (kubeconfig and in-cluster
config, auth plugins, TLS, connection pooling) and exchange plain dicts, as the API
server itself does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import quote

import urllib3
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.client.exceptions import ApiException

from dradriver.api import depth

Obj = dict[str, Any]


class KubeError(Exception):
    """An API request failed; `status` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"kubernetes API: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


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


def _error_from_response(status: int, reason: str, body: bytes) -> KubeError:
    return _error_from(
        ApiException(status=status, reason=reason, body=body.decode(errors="replace"))
    )


def _error_from(exc: ApiException) -> KubeError:
    status = int(exc.status or 0)
    reason = str(exc.reason or "")
    message = reason
    body = getattr(exc, "body", None)
    if body:
        try:
            decoded = json.loads(body)
            message = str(decoded.get("message", message))
            reason = str(decoded.get("reason", reason))
        except (ValueError, AttributeError):
            message = str(body)[:500]
    if status == 404:
        return NotFound(status, reason, message)
    if status == 409:
        return Conflict(status, reason, message)
    return KubeError(status, reason, message)


class Kube:
    """Plain-dict access to the API server. Thread-safe: the underlying pool is."""

    def __init__(self, api_client: Any, default_timeout: float = 30.0) -> None:
        self._api = api_client
        self._timeout = default_timeout

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> Kube:
        """Loads `path`, or the in-cluster config when `path` is None and we run in a pod,
        or the default kubeconfig otherwise."""
        cfg = kclient.Configuration()
        if path:
            kconfig.load_kube_config(config_file=path, client_configuration=cfg)
        else:
            try:
                kconfig.load_incluster_config(client_configuration=cfg)
            except kconfig.ConfigException:
                kconfig.load_kube_config(client_configuration=cfg)
        return cls(kclient.ApiClient(cfg))

    def with_token(self, token: str) -> Kube:
        """The same server and trust, authenticated as someone else (a ServiceAccount token)."""
        cfg = copy.copy(self._api.configuration)
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
        cfg.api_key_prefix = {}
        cfg.refresh_api_key_hook = None  # it would put the kubeconfig's credentials back
        cfg.cert_file = cfg.key_file = None
        return Kube(kclient.ApiClient(cfg), self._timeout)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        # Encoded here, compactly: the API server keeps opaque config parameters byte for
        # byte, and a later PATCH (which re-encodes them compactly) must not look like a
        # change to an immutable field.
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        t = timeout if timeout is not None else self._timeout
        try:
            method, url, headers, _, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=params,
                header_params=headers,
                auth_settings=["BearerToken"],
            )
            resp = self._api.rest_client.pool_manager.request(
                method,
                url,
                body=data,
                headers=headers,
                preload_content=False,
                # No hidden retries: urllib3's default (3) made one read take up to 4x
                # the timeout. Callers that want retries loop themselves, on their clock.
                retries=False,
                timeout=urllib3.Timeout(connect=t[0], read=t[1])
                if isinstance(t, tuple)
                else urllib3.Timeout(total=t),
            )
        except OSError as exc:
            raise KubeError(0, "Unreachable", str(exc)) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise KubeError(0, "Unreachable", str(exc)) from exc
        if not 200 <= resp.status < 300:
            raise _error_from_response(resp.status, str(resp.reason or ""), resp.data)
        return resp

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        resp = self._call(method, path, **kwargs)
        data = resp.data
        return cast(Obj, depth.loads(data)) if data else {}

    def text(self, path: str, timeout: float | None = None) -> str:
        """A non-JSON endpoint (the API server's /metrics)."""
        return str(self._call("GET", path, timeout=timeout).data.decode(errors="replace"))

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
        try:
            buf = b""
            for chunk in resp.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
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
        finally:
            resp.release_conn()
