"""What each request presents: the Authorization header from the library's Configuration
(its api key, renewed by its refresh hook: an exec plugin's token at expiry, the pod's
rotated token, an auth-provider's), and whether the client certificate files changed.

What the library lacks: it never looks at a client certificate file again, so a rotated
one (new files renamed over the old) is noticed here and new connections load it. The
files (a stat) and the refresh hook are looked at once a RECHECK_SECONDS at most.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from dradriver.k8s.errors import CredentialError, one_line

RECHECK_SECONDS = 1.0


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, mtime, size); None: missing."""
    try:
        st = os.stat(path)  # through symlinks: an atomic writer swaps a link
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class Credentials:
    """Thread-safe."""

    def __init__(self, cfg: Any) -> None:
        """`cfg`: the library's Configuration, filled by its loader."""
        self._cfg = cfg
        self._lock = threading.Lock()  # the library's refresh hooks rewrite cfg
        self._header: str | None = None
        self._header_until = 0.0
        cert = (str(cfg.cert_file), str(cfg.key_file or cfg.cert_file)) if cfg.cert_file else ()
        self._cert_files, self._cert_seen = cert, [_identity(p) for p in cert]
        self._cert_until = time.monotonic() + RECHECK_SECONDS

    def authorization(self) -> str | None:
        """The Authorization header (None: none). Raises CredentialError."""
        # Asked again at most once a RECHECK_SECONDS: the library's refresh hook rewrites
        # the whole Configuration each time (150 us, re-reading the environment's proxies).
        now = time.monotonic()
        with self._lock:
            if now >= self._header_until:
                try:
                    value = self._cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
                except Exception as exc:  # an exec plugin, a token file, an auth-provider
                    raise CredentialError(f"refreshing the credentials: {one_line(exc)}") from exc
                self._header = str(value) if value else None
                self._header_until = now + RECHECK_SECONDS
            return self._header

    def cert_files_changed(self) -> bool:
        """Whether the certificate files were replaced since last asked (at most once a
        RECHECK_SECONDS): connections made with the old ones should go."""
        now = time.monotonic()
        if not self._cert_files or now < self._cert_until:
            return False
        with self._lock:
            self._cert_until = now + RECHECK_SECONDS
            seen = [_identity(p) for p in self._cert_files]
            changed, self._cert_seen = seen != self._cert_seen, seen
            return changed
