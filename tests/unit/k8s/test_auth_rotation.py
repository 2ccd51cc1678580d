"""Credentials that change under a running client: a client certificate file replaced,
the pod's service-account token rotated by the kubelet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dradriver.k8s import Kube, auth
from tests.support.k8s.certs import TestCA
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig


def test_a_rotated_client_certificate_file_is_picked_up(
    mtls_api: FakeAPI,
    client_ca: TestCA,
    tmp_path: Path,
    write_kubeconfig: WriteKubeconfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    client_ca.issue("before", server=False).write(tmp_path, "client")
    cluster = {"server": mtls_api.url, "certificate-authority": str(mtls_api.ca_file)}
    user = {"client-certificate": "client.crt", "client-key": "client.key"}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, user)))
    assert kube.get("/who")["cn"] == "before"
    # As a certificate rotator does: new files renamed over the old ones.
    client_ca.issue("after", server=False).write(tmp_path, "new")
    os.replace(tmp_path / "new.key", tmp_path / "client.key")
    os.replace(tmp_path / "new.crt", tmp_path / "client.crt")
    assert kube.get("/who")["cn"] == "before"  # not looked at again within the second
    clock[0] += auth.RECHECK_SECONDS
    assert kube.get("/who")["cn"] == "after"
    assert kube.get("/who")["cn"] == "after"
    with mtls_api.lock:
        assert len({s.conn for s in mtls_api.seen}) == 2  # one connection per certificate
    kube.close()


def test_in_cluster_with_a_rotating_token(
    api: FakeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    monkeypatch.setattr(auth, "RECHECK_SECONDS", 0.0)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(api.ca.pem)
    (sa / "token").write_text("first")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
    kube = Kube.from_kubeconfig(None)
    assert kube.host == api.url
    assert kube.get("/version")["auth"] == "Bearer first"
    # The kubelet's atomic writer: a new directory, the ..data link swapped.
    (tmp_path / "new").write_text("second")
    os.replace(tmp_path / "new", sa / "token")
    assert kube.get("/version")["auth"] == "Bearer second"
    kube.close()
