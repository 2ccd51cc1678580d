"""Kubeconfigs and Configurations as the official library's loaders fill them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client import Configuration

# A kubeconfig written for one test: write(cluster, user=None, name="kubeconfig") -> path.
WriteKubeconfig = Callable[..., Path]


def configuration(server: str, token: str | None = None, **settings: Any) -> Configuration:
    """A Configuration as the library's loaders fill one."""
    cfg = Configuration(host=server, **settings)
    if token is not None:
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return cfg
