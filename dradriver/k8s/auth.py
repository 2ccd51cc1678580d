"""The credentials of each request: what a KubeConfig names, kept fresh (a rotated token
file re-read, an exec plugin re-run when its credential expires)."""

from __future__ import annotations

import base64
import os
import threading
import time
from typing import TYPE_CHECKING

from dradriver.k8s.config import ClientCert, KubeConfig
from dradriver.k8s.errors import CredentialError

if TYPE_CHECKING:
    from dradriver.k8s.exec_plugin import ExecCredential


class Credentials:
    """Thread-safe. Precedence as the official loader: token, token file, exec, basic."""

    def __init__(self, cfg: KubeConfig) -> None:
        self._cfg = cfg
        self._lock = threading.Lock()
        self._file_key: tuple[int, int, int] | None = None
        self._file_token: str | None = None
        self._exec: ExecCredential | None = None

    def current(self) -> tuple[str | None, ClientCert | None]:
        """The Authorization header (None: none) and the client certificate to present."""
        cfg = self._cfg
        if cfg.legacy is not None:
            return cfg.legacy.authorization(), cfg.client_cert
        if cfg.token:
            return f"Bearer {cfg.token}", cfg.client_cert
        if cfg.token_file:
            return f"Bearer {self._read_token_file(cfg.token_file)}", cfg.client_cert
        if cfg.exec is not None:
            cred = self._exec_credential()
            header = f"Bearer {cred.token}" if cred.token else None
            return header, cred.client_cert or cfg.client_cert
        if cfg.username is not None and cfg.password is not None:
            pair = base64.b64encode(f"{cfg.username}:{cfg.password}".encode()).decode()
            return f"Basic {pair}", cfg.client_cert
        return None, cfg.client_cert

    def unauthorized(self) -> None:
        """The server answered 401: an exec credential is re-fetched on the next request
        (it may have been revoked before its expiry)."""
        with self._lock:
            self._exec = None

    def _read_token_file(self, path: str) -> str:
        # A stat per request (microseconds) instead of a timer: a projected token is
        # swapped by the kubelet (a new inode behind ..data), and we see it at once.
        try:
            st = os.stat(path)
        except OSError as exc:
            raise CredentialError(f"token file {path}: {exc.strerror or exc}") from exc
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key != self._file_key or self._file_token is None:
                try:
                    with open(path, encoding="utf-8") as f:
                        token = f.read().strip()
                except (OSError, UnicodeDecodeError) as exc:
                    raise CredentialError(f"token file {path}: {exc}") from exc
                if not token:
                    raise CredentialError(f"token file {path} is empty")
                self._file_key, self._file_token = key, token
            return self._file_token

    def _exec_credential(self) -> ExecCredential:
        from dradriver.k8s import exec_plugin  # subprocess and datetime: exec users only

        assert self._cfg.exec is not None
        # One run at a time: concurrent requests wait for the same fresh credential.
        with self._lock:
            cred = self._exec
            if cred is None or (cred.expires_at is not None and time.time() >= cred.expires_at):
                cred = self._exec = exec_plugin.run(self._cfg.exec)
            return cred
