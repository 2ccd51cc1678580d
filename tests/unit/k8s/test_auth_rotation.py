"""A client certificate file replaced under a running client (the library reads it once;
the pod's rotated token is the library's, tests/unit/k8s/test_config.py)."""

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
