"""Impersonation from a kubeconfig user (`as`, `as-uid`, `as-groups`, `as-user-extra`):
the official Python library reads none of these, so the headers client-go sends for them
are built here.

One header per group and per extra value (the API server reads repeated headers, never a
comma-joined one), extra keys escaped as client-go escapes them.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from dradriver.k8s.errors import KubeconfigError

Headers = tuple[tuple[str, str], ...]  # names may repeat

# RFC 7230 token characters: what a header name may hold. client-go percent-encodes
# everything else in an extra's key, and "%" itself so that decoding is unambiguous.
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$&'*+-.^_`|~")


def headers(user: Mapping[str, Any], where: str) -> Headers:
    """The Impersonate-* headers for `user` (a kubeconfig user's body); `where` names the
    kubeconfig and the user in errors."""
    name, uid = user.get("as"), user.get("as-uid")
    groups, extra = user.get("as-groups") or [], user.get("as-user-extra") or {}
    if not name and (uid or groups or extra):
        raise KubeconfigError(f"{where}: as-uid, as-groups or as-user-extra without `as` (a user)")
    if not isinstance(groups, list) or not isinstance(extra, Mapping):
        raise KubeconfigError(f"{where}: as-groups must be a list and as-user-extra a mapping")
    out = [("Impersonate-User", str(name))] if name else []
    out += [("Impersonate-Uid", str(uid))] if uid else []
    out += [("Impersonate-Group", str(g)) for g in groups]
    for key, values in extra.items():
        for v in values if isinstance(values, list) else [values]:
            out.append((f"Impersonate-Extra-{escape_key(str(key))}", str(v)))
    return tuple(out)


def escape_key(key: str) -> str:
    """An extra's key as part of a header name ("scopes.example.com/x" ->
    "scopes.example.com%2Fx"), byte by byte over its UTF-8."""
    return "".join(chr(b) if chr(b) in _TOKEN else f"%{b:02X}" for b in key.encode())
