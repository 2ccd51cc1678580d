"""The credentials of each request, kept fresh: the Authorization header and the client
certificate.

The header comes from the library's Configuration (its api key and refresh hook: a
token, basic auth, an auth-provider), except where we renew what it reads only once: a
token file (a kubeconfig's tokenFile, the pod's service-account token, which the kubelet
rotates) is read again when it changes, and an exec plugin's credential (exec_auth.py)
when it expires or the server answers 401. Client certificate files are watched too, so
that a rotated certificate is presented on new connections. Files are looked at (a stat)
at most once a RECHECK_SECONDS, never once a request.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from dradriver.k8s.errors import CredentialError, one_line
from dradriver.k8s.exec_auth import ExecAuth
from dradriver.logs import get_logger

log = get_logger("k8s.auth")

RECHECK_SECONDS = 1.0

Identity = tuple[int, int, int, int] | None  # (device, inode, mtime, size); None: missing


def _identity(path: str) -> Identity:
    try:
        st = os.stat(path)  # through symlinks: an atomic writer swaps a link
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class FileWatch:
    """Whether some files changed since last asked, looked at no more than once a
    RECHECK_SECONDS. Thread-safe."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._paths = tuple(paths)
        self._lock = threading.Lock()
        self._seen = self._identities()
        self._next = time.monotonic() + RECHECK_SECONDS

    def changed(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        with self._lock:
            self._next = now + RECHECK_SECONDS
            seen = self._identities()
            if seen == self._seen:
                return False
            self._seen = seen
            return True

    def _identities(self) -> tuple[Identity, ...]:
        return tuple(_identity(p) for p in self._paths)


class TokenFile:
    """A bearer token in a file, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._watch = FileWatch([path])
        self._lock = threading.Lock()
        self._header: str | None = None

    def authorization(self) -> str:
        """Raises CredentialError when the file is gone, unreadable or empty."""
        changed = self._watch.changed()
        with self._lock:
            if self._header is None or changed:
                if self._header is not None:
                    log.info("token file changed; read again", path=self.path)
                self._header = f"Bearer {self._read()}"
            return self._header

    def _read(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"token file {self.path}: {exc}") from exc
        if not token:
            raise CredentialError(f"token file {self.path} is empty")
        return token


class Credentials:
    """What each request presents. Thread-safe."""

    def __init__(
        self, cfg: Any, *, token_file: str | None = None, exec_auth: ExecAuth | None = None
    ) -> None:
        """`cfg`: the library's Configuration, filled by its loader."""
        self._cfg = cfg
        self._lock = threading.Lock()  # the library's refresh hooks rewrite cfg
        self._token_file = TokenFile(token_file) if token_file else None
        self._exec = exec_auth
        self._cert: tuple[str, str] | None = None
        self._cert_watch: FileWatch | None = None
        self._header: str | None = None
        self._header_until = 0.0
        if cfg.cert_file:
            self._cert = (str(cfg.cert_file), str(cfg.key_file or cfg.cert_file))
            self._cert_watch = FileWatch(self._cert)

    @property
    def renewable(self) -> bool:
        """Whether a 401 may be cured by asking again (an exec plugin's credential)."""
        return self._exec is not None

    def current(self) -> tuple[str | None, tuple[str, str] | None]:
        """The Authorization header (None: none) and the client certificate's files.
        Raises CredentialError."""
        if self._exec is not None:
            cred = self._exec.current()
            if cred.authorization is not None:
                return cred.authorization, cred.cert or self._cert
            return self._configured(), cred.cert or self._cert
        if self._token_file is not None:
            return self._token_file.authorization(), self._cert
        return self._configured(), self._cert

    def cert_files_changed(self) -> bool:
        """Whether the certificate files were replaced since last asked (at most once a
        RECHECK_SECONDS): connections made with the old ones should go."""
        return self._cert_watch is not None and self._cert_watch.changed()

    def unauthorized(self) -> None:
        if self._exec is not None:
            self._exec.unauthorized()

    def _configured(self) -> str | None:
        # Asked again at most once a RECHECK_SECONDS: the library's refresh hook rewrites
        # the whole Configuration each time (150 us, re-reading the environment's
        # proxies), and what it refreshes (an auth-provider's token) expires in minutes.
        now = time.monotonic()
        with self._lock:
            if now >= self._header_until:
                try:
                    value = self._cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
                except Exception as exc:  # an auth-provider's refresh failed
                    why = one_line(exc)
                    raise CredentialError(
                        f"refreshing the kubeconfig's credentials: {why}"
                    ) from exc
                self._header = str(value) if value else None
                self._header_until = now + RECHECK_SECONDS
            return self._header
