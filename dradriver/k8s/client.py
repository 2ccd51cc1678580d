"""A thin JSON client for the Kubernetes API: plain dicts in and out, over the official
library's configuration and credentials (config.py, auth.py) and urllib3 (transport.py);
a 429 is the one thing retried (docs/design.md, "The API client")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlencode

from dradriver.api import depth
from dradriver.k8s import config as kubeconfig
from dradriver.k8s.auth import Credentials
from dradriver.k8s.errors import CredentialError, KubeError, NotFound, error_from_response
from dradriver.logs import get_logger

if TYPE_CHECKING:
    import urllib3

    from dradriver.k8s.transport import Timeout

__all__ = ["Kube", "KubeError", "Obj", "path_for"]

log = get_logger("k8s")

Obj = dict[str, Any]
# The longest Retry-After waited for inside a call; a server asking for more is asking
# the caller to back off, which it does on its own clock.
MAX_RETRY_AFTER = 10.0
DEFAULT_RETRY_AFTER = 1.0
# A PATCH's Content-Type (under application/) by its kind.
_PATCHES = {
    "merge": "merge-patch+json",
    "json": "json-patch+json",
    "strategic": "strategic-merge-patch+json",
    "apply": "apply-patch+yaml",
}


def path_for(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object (its parts positional, in the URL's order).

    ("v1", "pods", "ns", "p") -> /api/v1/namespaces/ns/pods/p
    """
    path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is not None:
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{plural}"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    return path if subresource is None else f"{path}/{subresource}"


class Kube:
    """Plain-dict access to the API server. Thread-safe: urllib3's pool is."""

    def __init__(self, config: Any, default_timeout: float = 30.0) -> None:
        """`config`: the library's `kubernetes.client.Configuration` (or an `ApiClient`,
        whose configuration is used), or what config.load made of a kubeconfig."""
        from dradriver.k8s.transport import Transport

        if not isinstance(config, kubeconfig.Loaded):
            config = kubeconfig.Loaded(getattr(config, "configuration", config))
        self._loaded, self._timeout = config, default_timeout
        self.host = str(config.configuration.host).rstrip("/")
        self._creds = Credentials(config.configuration)
        self._transport = Transport(config.configuration, config.impersonate)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> Kube:
        """Loads `path`, or the in-cluster config when `path` is None and we run in a pod,
        or the default kubeconfig otherwise. Raises KubeconfigError (one line)."""
        return cls(kubeconfig.load(path))

    def with_token(self, token: str) -> Kube:
        """The same server and trust, authenticated as someone else (a ServiceAccount token):
        no client certificate, no impersonation, nothing that could put the kubeconfig's
        credentials back."""
        return Kube(kubeconfig.with_token(self._loaded.configuration, token), self._timeout)

    def close(self) -> None:
        self._transport.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Timeout | None = None,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        path += _query(query)
        headers = {"Accept": "application/json", "User-Agent": "dradriver"}
        data = None
        if body is not None:
            # Compact, with sorted keys, as Go encodes: the API server keeps opaque config
            # parameters byte for byte, and a later PATCH or server-side apply (which
            # re-encodes them so) must not look like a change to an immutable field; a
            # ComputeDomain's template written in insertion order made every claim from it
            # refuse its node's status apply ("status.allocation: field is immutable").
            data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
            headers["Content-Type"] = content_type
        t = timeout if timeout is not None else self._timeout
        deadline = time.monotonic() + (sum(t) if isinstance(t, tuple) else t)
        while True:
            try:
                authorization = self._creds.authorization()
            except CredentialError as exc:
                raise KubeError(0, "NoCredentials", str(exc)) from exc
            if authorization is not None:
                headers["Authorization"] = authorization
            if self._creds.cert_files_changed():
                log.info("client certificate files replaced; reconnecting", server=self.host)
                self._transport.close()
            resp = self._transport.send(method, path, headers, body=data, timeout=t, stream=stream)
            if 200 <= resp.status < 300:
                return resp
            wait = _retry_after(resp) if resp.status == 429 else None
            left = deadline - time.monotonic()
            if wait is None or wait >= left:
                raise error_from_response(resp.status, str(resp.reason or ""), resp.data)
            _sleep(wait)
            if not isinstance(t, tuple):
                t = max(left - wait, 0.001)  # the whole call stays within its timeout

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        data = self._call(method, path, **kwargs).data
        return cast(Obj, depth.loads(data)) if data else {}

    def text(self, path: str, timeout: float | None = None) -> str:
        """A non-JSON endpoint (the API server's /metrics)."""
        return self._call("GET", path, timeout=timeout).data.decode(errors="replace")

    def get(self, path: str, timeout: float | None = None, **query: Any) -> Obj:
        return self.request("GET", path, query=query, timeout=timeout)

    def list(self, path: str, **query: Any) -> Obj:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body=body)

    def replace(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any, patch_type: str = "merge", **query: Any) -> Obj:
        content_type = f"application/{_PATCHES[patch_type]}"
        return self.request("PATCH", path, body=body, content_type=content_type, query=query)

    def apply(self, path: str, body: Obj, field_manager: str) -> Obj:
        """Server-side apply, forced: the server merges and tracks ownership per field
        manager, and takes the fields this manager sets from whoever held them."""
        return self.patch(path, body, "apply", fieldManager=field_manager, force="true")

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
        query.update(watch="true", timeoutSeconds=timeout_seconds, allowWatchBookmarks="true")
        query["resourceVersion"] = resource_version
        timeout = (10.0, timeout_seconds + 10.0)  # (connect, read): the server ends it first
        resp = self._call("GET", path, query=query, timeout=timeout, stream=True)
        import urllib3
        from kubernetes.watch.watch import iter_resp_lines

        finished = False
        try:
            for line in filter(str.strip, iter_resp_lines(resp)):  # a blank line is no event
                try:
                    event = cast(Obj, depth.loads(line))
                except (ValueError, RecursionError) as exc:
                    raise KubeError(0, "Unreachable", f"watch {path}: not JSON: {exc}") from exc
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code, reason = int(status.get("code", 0)), str(status.get("reason", ""))
                    raise KubeError(code, reason, str(status.get("message", "")))
                yield event
            finished = True
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # The stream broke, or went silent past its read timeout.
            from dradriver.k8s.transport import describe

            raise KubeError(0, "Unreachable", f"watch {path}: {describe(exc)}") from exc
        finally:
            if not finished:
                resp.close()  # unread bytes must not be taken for the next response
            resp.release_conn()


def _retry_after(resp: urllib3.BaseHTTPResponse) -> float | None:
    """Seconds a 429 asks to wait (1 when it does not say), or None when that is longer
    than we wait inside a call."""
    try:
        wait = max(float(resp.headers.get("Retry-After", DEFAULT_RETRY_AFTER)), 0.0)
    except ValueError:  # an HTTP date: the API server never sends one
        wait = DEFAULT_RETRY_AFTER
    return wait if wait <= MAX_RETRY_AFTER else None


_sleep = time.sleep  # the tests' clock: patching time.sleep would stop other threads' too


def _query(query: dict[str, Any] | None) -> str:
    """The query string as the official client encoded it ("?k=v&..."): None dropped,
    booleans lowercase, dicts as JSON, values percent-quoted ("/" kept)."""
    q = {
        k: str(v).lower() if isinstance(v, bool) else json.dumps(v) if isinstance(v, dict) else v
        for k, v in (query or {}).items()
        if v is not None
    }
    return "?" + urlencode(q, safe="/", quote_via=quote) if q else ""
