"""Loading a kubeconfig or the pod's service account into a KubeConfig, and the
credentials each request then carries."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dradriver.k8s import config
from dradriver.k8s.auth import Credentials
from dradriver.k8s.config import ClientCert, ConfigError, KubeConfig
from dradriver.k8s.errors import CredentialError
from tests.unit.k8s.conftest import WriteKubeconfig


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_token_and_ca_data(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://10.0.0.1:6443/", "certificate-authority-data": b64(b"PEM")},
        {"token": "abc"},
    )
    cfg = config.load(str(path))
    assert cfg.server == "https://10.0.0.1:6443"  # no trailing slash: paths are appended
    assert cfg.ca_data == b"PEM"
    assert cfg.token == "abc"
    assert Credentials(cfg).current() == ("Bearer abc", None)


def test_relative_files_are_relative_to_the_kubeconfig(
    write_kubeconfig: WriteKubeconfig, tmp_path: Path
) -> None:
    for name in ("ca.crt", "c.crt", "c.key"):
        (tmp_path / name).write_text("x")
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority": "ca.crt", "tls-server-name": "api"},
        {"client-certificate": "c.crt", "client-key": "c.key"},
    )
    cfg = config.load(str(path))
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    assert cfg.tls_server_name == "api"
    assert cfg.client_cert == ClientCert(
        cert_file=str(tmp_path / "c.crt"), key_file=str(tmp_path / "c.key")
    )
    assert Credentials(cfg).current() == (None, cfg.client_cert)


def test_client_cert_data(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://h", "insecure-skip-tls-verify": True},
        {"client-certificate-data": b64(b"CERT"), "client-key-data": b64(b"KEY")},
    )
    cfg = config.load(str(path))
    assert cfg.insecure
    assert cfg.client_cert == ClientCert(cert_pem=b"CERT", key_pem=b"KEY")


def test_a_cert_without_its_key_is_refused(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"client-certificate-data": b64(b"C")})
    with pytest.raises(ConfigError, match="without its key"):
        config.load(str(path))


def test_plain_http_ignores_tls_material(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "http://h:8080", "certificate-authority": "/nonexistent"},
        {"client-certificate": "/nonexistent", "client-key": "/nonexistent", "token": "t"},
    )
    cfg = config.load(str(path))
    assert (cfg.ca_file, cfg.client_cert, cfg.token) == (None, None, "t")


def test_token_file_is_reread_when_it_changes(
    write_kubeconfig: WriteKubeconfig, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    path = write_kubeconfig({"server": "https://h"}, {"tokenFile": "token"})
    creds = Credentials(config.load(str(path)))
    assert creds.current()[0] == "Bearer one"
    # As the kubelet rotates a projected token: a new file renamed over the old one.
    (tmp_path / "token.new").write_text("two")
    os.replace(tmp_path / "token.new", token)
    assert creds.current()[0] == "Bearer two"
    token.unlink()
    with pytest.raises(CredentialError, match="token"):
        creds.current()


def test_token_wins_over_token_file_and_exec(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://h"},
        {"token": "t", "tokenFile": "/nonexistent", "exec": {"command": "false"}},
    )
    cfg = config.load(str(path))
    assert (cfg.token, cfg.token_file, cfg.exec) == ("t", None, None)


def test_basic_auth(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"username": "u", "password": "p"})
    assert Credentials(config.load(str(path))).current()[0] == "Basic " + b64(b"u:p")


def test_contexts_and_merged_files(tmp_path: Path) -> None:
    a = {
        "current-context": "second",
        "clusters": [{"name": "one", "cluster": {"server": "https://one"}}],
        "users": [{"name": "alice", "user": {"token": "a"}}],
        "contexts": [
            {"name": "first", "context": {"cluster": "one", "user": "alice"}},
            {"name": "second", "context": {"cluster": "two", "user": "bob"}},
        ],
    }
    b = {
        "current-context": "first",  # the first file's current-context wins, as in kubectl
        "clusters": [
            {"name": "two", "cluster": {"server": "https://two"}},
            {"name": "one", "cluster": {"server": "https://shadowed"}},
        ],
        "users": [{"name": "bob", "user": {"token": "b"}}],
    }
    (tmp_path / "a").write_text(yaml.safe_dump(a))
    (tmp_path / "b").write_text(yaml.safe_dump(b))
    cfg = config.load(os.pathsep.join(str(tmp_path / n) for n in ("a", "missing", "b")))
    assert (cfg.server, cfg.token) == ("https://two", "b")


def test_a_context_without_a_user_is_anonymous(tmp_path: Path) -> None:
    doc = {
        "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://h"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c"}}],
    }
    (tmp_path / "k").write_text(yaml.safe_dump(doc))
    assert Credentials(config.load(str(tmp_path / "k"))).current() == (None, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("current-context: x\ncontexts: []\n", "no context named 'x'"),
        ("clusters: []\n", "no current-context"),
        ("key: [unclosed\n", "not valid YAML"),
        ("", "empty or not a mapping"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: ftp://h}}]\n",
            "not an http(s) URL",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
            "users: [{name: u, user: {tokenFile: /nonexistent/token}}]\n",
            "tokenFile",
        ),
    ],
)
def test_errors_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "k").write_text(text)
    with pytest.raises(ConfigError) as exc:
        config.load(str(tmp_path / "k"))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert str(tmp_path / "k") in str(exc.value)


def test_a_missing_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        config.load(str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not running in a pod and no kubeconfig"):
        config.load(None)


def test_kubeconfig_env_then_home(
    tmp_path: Path, write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = write_kubeconfig({"server": "https://from-env"})
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert config.load(None).server == "https://from-env"
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    path.rename(tmp_path / ".kube" / "config")
    assert config.load(None).server == "https://from-env"


def service_account(tmp_path: Path, token: str = "sa-token") -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_text("CA")
    return sa


def test_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = service_account(tmp_path)
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # in a pod, the pod's identity wins
    cfg = config.load(None)
    assert cfg == KubeConfig(
        server="https://10.96.0.1:443", ca_file=str(sa / "ca.crt"), token_file=str(sa / "token")
    )
    creds = Credentials(cfg)
    assert creds.current()[0] == "Bearer sa-token"
    (sa / "token").write_text("rotated-token")  # bound tokens rotate
    assert creds.current()[0] == "Bearer rotated-token"


def test_not_in_a_pod_without_the_service_account_files() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = config.load_incluster(env, "/nonexistent")
    assert cfg is None  # no service account files: not in a pod


def test_in_cluster_ipv6_server(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = config.load_incluster(env, str(service_account(tmp_path)))
    assert cfg is not None and cfg.server == "https://[fd00::1]:443"


def test_an_explicit_path_ignores_the_pod(
    tmp_path: Path, write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_DIR", str(service_account(tmp_path)))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    path = write_kubeconfig({"server": "https://explicit"})
    assert config.load(str(path)).server == "https://explicit"


def test_with_token_keeps_only_server_and_trust(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority-data": b64(b"CA")},
        {"client-certificate-data": b64(b"C"), "client-key-data": b64(b"K"), "token": "t"},
    )
    cfg = config.load(str(path)).with_token("sa")
    assert Credentials(cfg).current() == ("Bearer sa", None)
    assert cfg.ca_data == b"CA"


def test_auth_provider_falls_back_to_the_official_library(
    write_kubeconfig: WriteKubeconfig,
) -> None:
    # An OIDC id-token without expiry: the official loader uses it as is.
    claims = base64.urlsafe_b64encode(b'{"sub":"me"}').decode().rstrip("=")
    jwt = f"eyJhbGciOiJub25lIn0.{claims}.sig"
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority-data": b64(b"PEM")},
        {"auth-provider": {"name": "oidc", "config": {"id-token": jwt, "client-id": "x"}}},
    )
    cfg = config.load(str(path))
    assert cfg.legacy is not None
    assert cfg.server == "https://h"
    assert cfg.ca_file is not None and Path(cfg.ca_file).read_bytes() == b"PEM"
    assert Credentials(cfg).current()[0] == f"Bearer {jwt}"
    # Someone else's identity replaces the official library's entirely.
    assert Credentials(cfg.with_token("sa")).current() == ("Bearer sa", None)


def test_the_common_path_does_not_import_the_official_library(
    write_kubeconfig: WriteKubeconfig,
) -> None:
    path = write_kubeconfig(
        {"server": "https://h", "insecure-skip-tls-verify": True},
        {"exec": {"command": "true", "apiVersion": "client.authentication.k8s.io/v1"}},
    )
    code = (
        "import sys; from dradriver.k8s import Kube; "
        f"k = Kube.from_kubeconfig({str(path)!r}); "
        "assert 'kubernetes' not in sys.modules and 'urllib3' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('kubernetes', 'urllib3')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
