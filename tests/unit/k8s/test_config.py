"""Loading a kubeconfig or the pod's service account through the official library's
loaders, what we add on top, and the credentials each request then carries."""

from __future__ import annotations

import base64
import datetime as dt
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.k8s import auth, config
from dradriver.k8s.auth import Credentials
from dradriver.k8s.config import Loaded
from dradriver.k8s.errors import CredentialError, KubeconfigError
from tests.support.k8s.kubeconfig import WriteKubeconfig


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def creds(loaded: Loaded) -> Credentials:
    return Credentials(loaded.configuration)


@pytest.fixture
def recheck_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files looked at on every request, not once a second."""
    monkeypatch.setattr(auth, "RECHECK_SECONDS", 0.0)


def test_token_and_ca_data(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://10.0.0.1:6443/", "certificate-authority-data": b64(b"PEM")},
        {"token": "abc"},
    )
    loaded = config.load(str(path))
    cfg = loaded.configuration
    assert cfg.host == "https://10.0.0.1:6443"  # no trailing slash: paths are appended
    assert Path(cfg.ssl_ca_cert).read_bytes() == b"PEM"
    assert cfg.verify_ssl
    assert creds(loaded).authorization() == "Bearer abc"
    assert loaded.impersonate == ()


def test_relative_files_are_relative_to_the_kubeconfig(
    write_kubeconfig: WriteKubeconfig, tmp_path: Path
) -> None:
    for name in ("ca.crt", "c.crt", "c.key"):
        (tmp_path / name).write_text("x")
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority": "ca.crt", "tls-server-name": "api"},
        {"client-certificate": "c.crt", "client-key": "c.key"},
    )
    loaded = config.load(str(path))
    cfg = loaded.configuration
    assert cfg.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert cfg.tls_server_name == "api"
    assert (cfg.cert_file, cfg.key_file) == (str(tmp_path / "c.crt"), str(tmp_path / "c.key"))
    assert creds(loaded).authorization() is None


def test_client_cert_data(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://h", "insecure-skip-tls-verify": True},
        {"client-certificate-data": b64(b"CERT"), "client-key-data": b64(b"KEY")},
    )
    cfg = config.load(str(path)).configuration
    assert not cfg.verify_ssl
    assert Path(cfg.cert_file).read_bytes() == b"CERT"
    assert Path(cfg.key_file).read_bytes() == b"KEY"


def test_plain_http_ignores_tls_material(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "http://h:8080", "certificate-authority": "/nonexistent"},
        {"client-certificate": "/nonexistent", "client-key": "/nonexistent", "token": "t"},
    )
    loaded = config.load(str(path))
    assert (loaded.configuration.ssl_ca_cert, loaded.configuration.cert_file) == (None, None)
    assert creds(loaded).authorization() == "Bearer t"


def test_token_file_is_reread_when_it_changes(
    write_kubeconfig: WriteKubeconfig, tmp_path: Path, recheck_at_once: None
) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    path = write_kubeconfig({"server": "https://h"}, {"tokenFile": "token"})
    c = creds(config.load(str(path)))
    assert c.authorization() == "Bearer one"
    # As the kubelet rotates a projected token: a new file renamed over the old one.
    (tmp_path / "token.new").write_text("two")
    os.replace(tmp_path / "token.new", token)
    assert c.authorization() == "Bearer two"
    token.unlink()
    with pytest.raises(CredentialError, match=f"token file {token}: .*No such file"):
        c.authorization()


def test_token_wins_over_token_file_and_exec(
    write_kubeconfig: WriteKubeconfig, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    path = write_kubeconfig(
        {"server": "https://h"},
        {
            "token": "t",
            "tokenFile": "/nonexistent",
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "touch",
                "args": [str(ran)],
            },
        },
    )
    assert creds(config.load(str(path))).authorization() == "Bearer t"
    assert not ran.exists()  # the loader never ran the plugin


def test_basic_auth(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"username": "u", "password": "p"})
    assert creds(config.load(str(path))).authorization() == "Basic " + b64(b"u:p")


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
    loaded = config.load(os.pathsep.join(str(tmp_path / n) for n in ("a", "missing", "b")))
    assert loaded.configuration.host == "https://two"
    assert creds(loaded).authorization() == "Bearer b"


def test_a_context_without_a_user_is_anonymous(tmp_path: Path) -> None:
    doc = {
        "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://h"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c"}}],
    }
    (tmp_path / "k").write_text(yaml.safe_dump(doc))
    assert creds(config.load(str(tmp_path / "k"))).authorization() is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("current-context: x\ncontexts: []\n", "Expected object with name x"),
        ("clusters: []\n", "no current-context"),
        ("key: [unclosed\n", "not valid YAML"),
        ("", "is empty"),
        ("- a list\n", "not a kubeconfig"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {server: ftp://h}}]\n",
            "not an http(s) URL",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
            "clusters: [{name: c, cluster: {insecure-skip-tls-verify: true}}]\n",
            "has no server",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
            "users: [{name: u, user: {tokenFile: /nonexistent/token}}]\n",
            "No such file or directory: /nonexistent/token",
        ),
    ],
)
def test_errors_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "k").write_text(text)
    with pytest.raises(KubeconfigError) as exc:
        config.load(str(tmp_path / "k"))
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert str(tmp_path / "k") in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_a_missing_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeconfigError, match="no such file"):
        config.load(str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(KubeconfigError) as exc:
        config.load(None)
    assert str(exc.value) == (
        "not running in a pod (Service host/port is not set) and no kubeconfig at "
        f"{tmp_path / 'missing'}: no such file"
    )


def test_kubeconfig_env_then_home(
    tmp_path: Path, write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = write_kubeconfig({"server": "https://from-env"})
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert config.load(None).configuration.host == "https://from-env"
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    path.rename(tmp_path / ".kube" / "config")
    assert config.load(None).configuration.host == "https://from-env"


def service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str = "sa-token"
) -> Path:
    """The pod's service account files, where the library's in-cluster loader looks."""
    from kubernetes.config import incluster_config

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_text("CA")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(sa / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(sa / "ca.crt"))
    return sa


def in_a_pod(monkeypatch: pytest.MonkeyPatch, host: str = "10.96.0.1", port: str = "443") -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)


def a_minute_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the library's in-cluster loader, which reads the token again once a minute."""
    from kubernetes.config import incluster_config

    class Later(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Later:
            return cls.fromtimestamp(time.time() + 61, tz)

    clock = types.SimpleNamespace(datetime=Later, timedelta=dt.timedelta)
    monkeypatch.setattr(incluster_config, "datetime", clock)


def test_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recheck_at_once: None) -> None:
    sa = service_account(tmp_path, monkeypatch)
    in_a_pod(monkeypatch)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")  # in a pod, the pod's identity wins
    loaded = config.load(None)
    assert loaded.configuration.host == "https://10.96.0.1:443"
    assert loaded.configuration.ssl_ca_cert == str(sa / "ca.crt")
    c = creds(loaded)
    assert c.authorization() == "bearer sa-token"
    (sa / "token").write_text("rotated-token")  # bound tokens rotate
    a_minute_passes(monkeypatch)
    assert c.authorization() == "bearer rotated-token"


def test_not_in_a_pod_without_the_service_account_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "none"))
    in_a_pod(monkeypatch, "fd00::1")
    loaded, why = config.load_incluster()
    assert loaded is None
    assert why == "Service token file does not exist"


def test_in_cluster_ipv6_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service_account(tmp_path, monkeypatch)
    in_a_pod(monkeypatch, "fd00::1")
    loaded, _ = config.load_incluster()
    assert loaded is not None and loaded.configuration.host == "https://[fd00::1]:443"


def test_an_explicit_path_ignores_the_pod(
    tmp_path: Path, write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    service_account(tmp_path, monkeypatch)
    in_a_pod(monkeypatch)
    path = write_kubeconfig({"server": "https://explicit"})
    assert config.load(str(path)).configuration.host == "https://explicit"


def test_with_token_keeps_only_server_and_trust(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority-data": b64(b"CA"), "tls-server-name": "n"},
        {
            "client-certificate-data": b64(b"C"),
            "client-key-data": b64(b"K"),
            "token": "t",
            "as": "someone",
        },
    )
    cfg = config.load(str(path)).configuration
    other = config.with_token(cfg, "sa")
    assert Credentials(other).authorization() == "Bearer sa"
    assert (other.host, other.ssl_ca_cert, other.tls_server_name) == (
        "https://h",
        cfg.ssl_ca_cert,
        "n",
    )
    assert other.refresh_api_key_hook is None and other.username is None


def test_auth_provider_comes_from_the_library(write_kubeconfig: WriteKubeconfig) -> None:
    # An OIDC id-token without expiry: the official loader uses it as is.
    claims = base64.urlsafe_b64encode(b'{"sub":"me"}').decode().rstrip("=")
    jwt = f"eyJhbGciOiJub25lIn0.{claims}.sig"
    path = write_kubeconfig(
        {"server": "https://h", "certificate-authority-data": b64(b"PEM")},
        {"auth-provider": {"name": "oidc", "config": {"id-token": jwt, "client-id": "x"}}},
    )
    loaded = config.load(str(path))
    assert loaded.configuration.refresh_api_key_hook is not None
    assert creds(loaded).authorization() == f"Bearer {jwt}"


def test_the_configurations_refresh_hook_runs_once_a_second_at_most(
    write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    cfg = config.load(str(write_kubeconfig({"server": "https://h"}, {"token": "t"}))).configuration
    calls: list[Any] = []
    real = cfg.get_api_key_with_prefix  # which runs the hook (and rewrites cfg)
    cfg.get_api_key_with_prefix = lambda *a, **kw: calls.append(a) or real(*a, **kw)
    c = Credentials(cfg)
    for _ in range(20):
        assert c.authorization() == "Bearer t"
    assert len(calls) == 1
    clock[0] += auth.RECHECK_SECONDS
    c.authorization()
    assert len(calls) == 2


def test_importing_the_package_imports_neither_the_library_nor_urllib3(
    write_kubeconfig: WriteKubeconfig,
) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"token": "t"})
    code = (
        "import sys; import dradriver.k8s; from dradriver.k8s import Kube\n"
        "heavy = lambda: sorted(m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'urllib3', 'yaml', 'ssl'))\n"
        "assert heavy() == [], heavy()\n"
        f"Kube.from_kubeconfig({str(path)!r})\n"
        "assert 'kubernetes.config.kube_config' in sys.modules and 'urllib3' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[3]
    )
    assert done.returncode == 0, done.stderr  # the child's own assert says what it found
