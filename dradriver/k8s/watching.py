"""Resuming a watch where it stopped (pure): the resourceVersion an event leaves it at, and
the failures after which it may go on from there instead of listing again.

A watch ends every timeoutSeconds and breaks when a connection does; going on from the
last version seen (an event's, or a BOOKMARK's, which the server sends so that quiet
watches keep a recent one) misses nothing and costs the API server no LIST.
"""

from __future__ import annotations

from typing import Any

from dradriver.k8s.errors import KubeError


def resource_version(event: dict[str, Any]) -> str | None:
    """The resourceVersion of a watch event's object (BOOKMARKs carry one too)."""
    meta = (event.get("object") or {}).get("metadata") or {}
    rv = meta.get("resourceVersion")
    return str(rv) if rv else None


def resumable(exc: KubeError) -> bool:
    """Whether a watch that failed with `exc` may start again from its last
    resourceVersion: yes after a broken stream, a timeout, a 429 or a server error; not
    once the version is gone (410, compacted away), nor when the server refused the
    request as made (any other 4xx, or a version it has not reached yet)."""
    if "too large resource version" in exc.message.lower():
        return False
    return exc.status in (0, 429) or exc.status >= 500
