"""client-go credential plugins (a kubeconfig user's `exec`), run by the official
library's ExecProvider, with what its kubeconfig loader leaves out added on top:

- the plugin runs at the first request, not at load, and its credential is cached until
  its expirationTimestamp, or until a 401 (the loader renews a token when it expires,
  never after a 401);
- a client certificate from the plugin is renewed the same way, written to private files
  the connection pool loads (the loader never renews one);
- a failure is an error naming the plugin, with its installHint when it is missing (the
  loader logs the failure and goes on without credentials);
- provideClusterInfo passes the cluster as client-go does (its CA as data, the exec
  extension as `config`), not the kubeconfig's entry with a file path in it;
- interactiveMode: `Always` without a terminal is refused at load (a daemon never has
  one). What remains the library's: it decides whether to hand the plugin the terminal
  by whether stdout is one, where client-go looks at stdin and honours `Never`. So
  `Never` holds in a daemon (its stdout is a pipe or a file), but a command run at a
  terminal (`dradriver doctor`) lets an `IfAvailable` or `Never` plugin prompt there;
- the library waits for the plugin without a time limit: one that hangs (a browser login
  nobody completes) holds up the requests that wait for its credential.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.k8s.errors import CredentialError, KubeconfigError, one_line
from dradriver.logs import get_logger

log = get_logger("k8s.exec")

INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
# The fields of client-go's ExecCredential Cluster, as they are named in a kubeconfig.
_CLUSTER_FIELDS = (
    "server",
    "tls-server-name",
    "insecure-skip-tls-verify",
    "certificate-authority-data",
    "proxy-url",
    "disable-compression",
)
_EXEC_EXTENSION = "client.authentication.k8s.io/exec"


@dataclass(frozen=True)
class ExecCredential:
    authorization: str | None  # "Bearer ..."
    cert: tuple[str, str] | None  # (certificate file, key file)
    expires_at: float | None  # epoch seconds; None: valid until the server says 401


def has_terminal() -> bool:
    """What an interactive plugin needs: client-go asks for stdin to be a terminal, the
    library hands it over only when stdout is one."""
    return all(hasattr(f, "isatty") and f.isatty() for f in (sys.stdin, sys.stdout))


class ExecAuth:
    """One user's plugin. Thread-safe: concurrent requests wait for the same run."""

    def __init__(
        self,
        exec_node: Any,
        *,
        cwd: str,
        cluster: Mapping[str, Any],
        cluster_dir: str,
        where: str,
    ) -> None:
        """`exec_node`: the library's ConfigNode of the user's `exec`; `cluster`: the
        context's cluster entry, whose relative CA path starts at `cluster_dir`; `where`
        names the kubeconfig and the user in errors. Raises KubeconfigError."""
        from kubernetes.config.exec_provider import ExecProvider
        from kubernetes.config.kube_config import ConfigNode

        self.command = str(exec_node.safe_get("command") or "")
        self._where = where
        mode = str(exec_node.safe_get("interactiveMode") or "IfAvailable")
        if mode not in INTERACTIVE_MODES:
            modes = ", ".join(INTERACTIVE_MODES)
            raise KubeconfigError(f"{where}: exec interactiveMode {mode!r} is not one of {modes}")
        if mode == "Always" and not has_terminal():
            raise KubeconfigError(
                f"{where}: the exec plugin {self.command} wants interactiveMode Always and "
                "this process has no terminal to prompt on; set interactiveMode to "
                "IfAvailable or Never in the kubeconfig, or give the user a credential "
                "that needs no prompt (a token, a client certificate)"
            )
        info = None
        if exec_node.safe_get("provideClusterInfo"):
            info = ConfigNode("cluster", _cluster_info(cluster, cluster_dir, where))
        self._hint = " ".join(str(exec_node.safe_get("installHint") or "").split())
        try:
            self._provider = ExecProvider(exec_node, cwd, info)
        except Exception as exc:  # ConfigException: no command or apiVersion
            raise KubeconfigError(f"{where}: {one_line(exc)}") from exc
        self._lock = threading.Lock()
        self._cred: ExecCredential | None = None
        self._pems: tuple[str, str] | None = None
        self._paths: tuple[str, str] | None = None
        self._dir: str | None = None
        self._written = 0

    def current(self) -> ExecCredential:
        """The cached credential, or a new one from the plugin when it has expired.
        Raises CredentialError."""
        with self._lock:
            cred = self._cred
            if cred is None or (cred.expires_at is not None and time.time() >= cred.expires_at):
                cred = self._cred = self._run()
            return cred

    def unauthorized(self) -> None:
        """The server answered 401: the next request runs the plugin again (the
        credential may have been revoked before its expiry)."""
        with self._lock:
            self._cred = None

    def _run(self) -> ExecCredential:
        from kubernetes.config.dateutil import parse_rfc3339

        name = f"exec plugin {self.command}"
        try:
            status = self._provider.run()
        except FileNotFoundError as exc:
            hint = f" ({self._hint})" if self._hint else ""
            raise CredentialError(f"{name}: not found{hint}") from exc
        except OSError as exc:
            raise CredentialError(f"{name}: cannot run: {one_line(exc)}") from exc
        except Exception as exc:  # ConfigException: exit status, bad output, apiVersion
            raise CredentialError(f"{name}: {one_line(exc).removeprefix('exec: ')}") from exc
        if not isinstance(status, dict):
            raise CredentialError(f"{name}: the ExecCredential's status is not an object")
        token = status.get("token")
        cert_pem, key_pem = status.get("clientCertificateData"), status.get("clientKeyData")
        if bool(cert_pem) != bool(key_pem):
            raise CredentialError(
                f"{name}: clientCertificateData and clientKeyData come together or not at all"
            )
        if not token and not cert_pem:
            raise CredentialError(f"{name}: ExecCredential has neither a token nor a certificate")
        expires_at = None
        if stamp := status.get("expirationTimestamp"):
            try:
                expires_at = parse_rfc3339(str(stamp)).timestamp()
            except Exception as exc:  # the library's parser fails with AttributeError
                raise CredentialError(f"{name}: bad expirationTimestamp {stamp!r}") from exc
        cert = self._cert_files(str(cert_pem), str(key_pem)) if cert_pem else None
        log.info(
            "exec plugin gave a credential",
            command=self.command,
            token=bool(token),
            certificate=bool(cert),
            expires=stamp or "on a 401",
        )
        return ExecCredential(f"Bearer {token}" if token else None, cert, expires_at)

    def _cert_files(self, cert_pem: str, key_pem: str) -> tuple[str, str]:
        """Files for the plugin's certificate (ssl loads one only from a file): new names
        for a new certificate, so that a connection being opened with the old pair never
        reads half of each; the pair before the previous one is removed."""
        if self._paths is not None and self._pems == (cert_pem, key_pem):
            return self._paths
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="dradriver-exec-")  # 0700
            weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._written += 1
        n = self._written
        for old in (f"cert-{n - 2}.pem", f"key-{n - 2}.pem"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._dir, old))
        self._paths = (
            _write_private(os.path.join(self._dir, f"cert-{n}.pem"), cert_pem),
            _write_private(os.path.join(self._dir, f"key-{n}.pem"), key_pem),
        )
        self._pems = (cert_pem, key_pem)
        return self._paths


def _cluster_info(cluster: Mapping[str, Any], cluster_dir: str, where: str) -> dict[str, Any]:
    info = {k: cluster[k] for k in _CLUSTER_FIELDS if k in cluster}
    ca = cluster.get("certificate-authority")
    if ca and "certificate-authority-data" not in info:
        path = os.path.join(cluster_dir, str(ca))
        try:
            with open(path, "rb") as f:
                info["certificate-authority-data"] = base64.b64encode(f.read()).decode()
        except OSError as exc:
            raise KubeconfigError(
                f"{where}: exec: cannot read the cluster CA {path}: {exc}"
            ) from exc
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, Mapping) and ext.get("name") == _EXEC_EXTENSION:
            info["config"] = ext.get("extension")
    return info


def _write_private(path: str, data: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    return path
