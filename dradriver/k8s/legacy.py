"""The official `kubernetes` library, for the few configs only it can authenticate
(the deprecated auth-provider). Imported here, lazily: importing it costs ~400 ms and
~32 MiB, which the common configs must not pay."""

from __future__ import annotations

import threading
from typing import Any

from dradriver.k8s.config import ClientCert, ConfigError, KubeConfig


def load_with_official_library(paths: str) -> KubeConfig:
    """The kubeconfig's current context as the official loader sees it; its token (and
    the refresh of an expired one) comes from the Configuration it fills."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    try:
        kconfig.load_kube_config(config_file=paths, client_configuration=cfg)
    except Exception as exc:  # ConfigException, and whatever its auth plugins raise
        raise ConfigError(f"kubeconfig {paths}: {' '.join(str(exc).split())}") from exc
    return from_official(cfg)


def from_official(cfg: Any) -> KubeConfig:
    """A KubeConfig for a filled official `Configuration` (duck-typed: nothing imported)."""
    cert = None
    if getattr(cfg, "cert_file", None) and getattr(cfg, "key_file", None):
        cert = ClientCert(cert_file=str(cfg.cert_file), key_file=str(cfg.key_file))
    has_auth = bool(getattr(cfg, "api_key", None)) or getattr(cfg, "refresh_api_key_hook", None)
    return KubeConfig(
        server=str(cfg.host).rstrip("/"),
        ca_file=str(cfg.ssl_ca_cert) if getattr(cfg, "ssl_ca_cert", None) else None,
        insecure=not getattr(cfg, "verify_ssl", True),
        tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        proxy_url=getattr(cfg, "proxy", None) or None,
        client_cert=cert,
        legacy=LegacyAuth(cfg) if has_auth else None,
    )


class LegacyAuth:
    """The Authorization header an official Configuration yields. Its refresh hooks
    rewrite the Configuration in place, so calls are serialized."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg
        self._lock = threading.Lock()

    def authorization(self) -> str | None:
        with self._lock:
            value = self._cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        return str(value) if value else None
