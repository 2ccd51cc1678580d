"""The API's failures as typed errors, one class per status a caller branches on (401,
403, 404, 409, 410, 429), status 0 for a server that never answered; a kubeconfig that
cannot be used is a KubeconfigError."""

from __future__ import annotations

import json


class KubeError(Exception):
    """An API request failed; `status` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"kubernetes API: {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class Unauthorized(KubeError):
    """401: the credentials were refused (an expired token, a revoked certificate)."""


class Forbidden(KubeError):
    """403: authenticated, and not allowed (RBAC, an admission policy, the Node authorizer)."""


class NotFound(KubeError):
    """404."""


class Conflict(KubeError):
    """409: the object changed since it was read, or exists already."""


class Gone(KubeError):
    """410: a watch's resourceVersion is too old; list again."""


class TooManyRequests(KubeError):
    """429: the API server's priority and fairness turned the request away for now."""


_BY_STATUS: dict[int, type[KubeError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: TooManyRequests,
}


class KubeconfigError(ValueError):
    """The config cannot be used; str() is one line naming the file and the problem.

    A ValueError so callers that caught the official library's errors as ValueError still
    catch it."""


class CredentialError(Exception):
    """No credentials for a request (an exec plugin failed, the token file vanished);
    str() is one line. Kube raises it as a KubeError with status 0."""


def one_line(exc: BaseException) -> str:
    """An exception's text on one line: the library's messages span several."""
    return " ".join(str(exc).split()) or type(exc).__name__


def error_from_response(status: int, reason: str, body: bytes) -> KubeError:
    """The error for a non-2xx answer; a Status body's message and reason win over the
    HTTP reason phrase, which says nothing ("Not Found") about what was missing."""
    message = reason
    if body:
        text = body.decode(errors="replace")
        try:
            decoded = json.loads(text)
            message = str(decoded.get("message", message))
            reason = str(decoded.get("reason", reason))
        except (ValueError, AttributeError):
            message = text[:500]
    return _BY_STATUS.get(status, KubeError)(status, reason, message)
