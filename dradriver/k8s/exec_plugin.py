"""client-go credential plugins: run the kubeconfig's `exec` command and read the
ExecCredential it prints (a token, or a client certificate and key)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime

from dradriver.k8s.config import ClientCert, ExecConfig
from dradriver.k8s.errors import CredentialError

# A plugin that hangs (waiting for a browser login nobody will do) must not hang every
# request forever; client-go has no limit, but it is interactive, we are not.
EXEC_TIMEOUT = 60.0


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    client_cert: ClientCert | None
    expires_at: float | None  # epoch seconds; None: valid until the server says 401


def run(cfg: ExecConfig) -> ExecCredential:
    info: dict[str, object] = {
        "apiVersion": cfg.api_version,
        "kind": "ExecCredential",
        # Never interactive: a daemon has no one to answer a prompt.
        "spec": {"interactive": False},
    }
    if cfg.cluster is not None:
        info["spec"] = {"interactive": False, "cluster": cfg.cluster}
    env = dict(os.environ)
    env.update(cfg.env)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    name = f"exec plugin {cfg.command}"
    try:
        proc = subprocess.run(
            [cfg.command, *cfg.args],
            env=env,
            cwd=cfg.base_dir or None,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=EXEC_TIMEOUT,
            check=False,
        )
    except FileNotFoundError as exc:
        hint = f" ({' '.join(cfg.install_hint.split())})" if cfg.install_hint else ""
        raise CredentialError(f"{name}: not found{hint}") from exc
    except subprocess.TimeoutExpired as exc:
        raise CredentialError(f"{name}: no answer in {EXEC_TIMEOUT:g} s") from exc
    except OSError as exc:
        raise CredentialError(f"{name}: cannot run: {exc}") from exc
    if proc.returncode != 0:
        err = " ".join(proc.stderr.decode(errors="replace").split())[:300]
        why = f"{name}: exit status {proc.returncode}"
        raise CredentialError(f"{why}: {err}" if err else why)
    return parse(proc.stdout, cfg.api_version, name)


def parse(stdout: bytes, api_version: str, name: str = "exec plugin") -> ExecCredential:
    try:
        doc = json.loads(stdout)
    except ValueError as exc:
        raise CredentialError(f"{name}: output is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise CredentialError(f"{name}: output is not an ExecCredential")
    if doc.get("apiVersion") != api_version:
        raise CredentialError(
            f"{name}: answered apiVersion {doc.get('apiVersion')!r}, asked for {api_version!r}"
        )
    status = doc.get("status")
    if not isinstance(status, dict):
        raise CredentialError(f"{name}: ExecCredential has no status")
    token = status.get("token") or None
    cert_pem, key_pem = status.get("clientCertificateData"), status.get("clientKeyData")
    cert = None
    if cert_pem or key_pem:
        if not cert_pem or not key_pem:
            raise CredentialError(
                f"{name}: clientCertificateData and clientKeyData come together or not at all"
            )
        cert = ClientCert(cert_pem=str(cert_pem).encode(), key_pem=str(key_pem).encode())
    if token is None and cert is None:
        raise CredentialError(f"{name}: ExecCredential has neither a token nor a certificate")
    expires_at = None
    if stamp := status.get("expirationTimestamp"):
        try:
            expires_at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise CredentialError(f"{name}: bad expirationTimestamp {stamp!r}") from exc
    return ExecCredential(str(token) if token else None, cert, expires_at)
