from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.k8s import Kube
from tests.support.k8s.certs import TestCA
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig, configuration


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeAPI]:
    srv = FakeAPI(tmp_path)
    yield srv
    srv.close()


@pytest.fixture
def kube(api: FakeAPI) -> Iterator[Kube]:
    """A client of `api` with a token and its CA."""
    k = Kube(configuration(api.url, "secret", ssl_ca_cert=str(api.ca_file)))
    yield k
    k.close()


@pytest.fixture
def client_ca() -> TestCA:
    return TestCA("client CA")


@pytest.fixture
def mtls_api(tmp_path: Path, client_ca: TestCA) -> Iterator[FakeAPI]:
    """Asks for a client certificate (optional, so token-only clients get in too)."""
    srv = FakeAPI(tmp_path, client_ca=client_ca)
    yield srv
    srv.close()


@pytest.fixture
def write_kubeconfig(tmp_path: Path) -> WriteKubeconfig:
    """A one-context kubeconfig; `cluster` and `user` are the entries' bodies."""

    def write(
        cluster: dict[str, Any], user: dict[str, Any] | None = None, name: str = "kubeconfig"
    ) -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "ctx",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": user or {}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        }
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc))
        return path

    return write
