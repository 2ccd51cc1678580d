"""client-go exec credential plugins, run by the library's ExecProvider: the kubeconfig's
args, env and KUBERNETES_EXEC_INFO; their token or certificate cached until it expires
or the server answers 401; interactiveMode; failures as one-line errors."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, KubeconfigError, KubeError, config, exec_auth
from dradriver.k8s.auth import Credentials
from dradriver.k8s.errors import CredentialError
from tests.support.k8s.certs import Pair, TestCA
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig

V1 = "client.authentication.k8s.io/v1"
HOUR = dt.timedelta(hours=1)

# Prints the ExecCredential in cred.json, after noting each run and its input; with
# several cred.json.N files, run N prints the Nth.
PLUGIN = """
import json, os, pathlib, sys
d = pathlib.Path(os.environ["PLUGIN_DIR"])
with open(d / "runs", "a") as f:
    f.write(json.dumps({"info": json.loads(os.environ["KUBERNETES_EXEC_INFO"]),
                        "args": sys.argv[1:], "cwd": os.getcwd()}) + "\\n")
if (d / "fail").exists():
    sys.stderr.write("login required\\n")
    sys.exit(3)
sys.stdout.write((d / "cred.json").read_text())
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    d = tmp_path / "plugin"
    d.mkdir()
    (d / "plugin.py").write_text(PLUGIN)
    return d


def credential(d: Path, status: dict[str, Any], api_version: str = V1) -> None:
    doc = {"apiVersion": api_version, "kind": "ExecCredential", "status": status}
    (d / "cred.json").write_text(json.dumps(doc))


def runs(d: Path) -> list[dict[str, Any]]:
    path = d / "runs"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def exec_user(d: Path, api_version: str = V1, **extra: Any) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": api_version,
            "command": sys.executable,
            "args": [str(d / "plugin.py"), "--flag"],
            "env": [{"name": "PLUGIN_DIR", "value": str(d)}],
            **extra,
        }
    }


def stamp(delta: dt.timedelta) -> str:
    return (dt.datetime.now(dt.UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def creds(path: Path) -> Credentials:
    loaded = config.load(str(path))
    assert loaded.exec is not None
    return Credentials(loaded.configuration, exec_auth=loaded.exec)


@pytest.mark.parametrize(
    "api_version",
    [V1, "client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1alpha1"],
)
def test_a_token_is_cached_until_it_expires(
    plugin: Path, write_kubeconfig: WriteKubeconfig, api_version: str
) -> None:
    credential(plugin, {"token": "t1", "expirationTimestamp": stamp(HOUR)}, api_version)
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin, api_version))
    c = creds(path)
    assert runs(plugin) == []  # not at load: at the first request
    assert c.current() == ("Bearer t1", None)
    assert c.current() == ("Bearer t1", None)
    (run,) = runs(plugin)
    assert run["args"] == ["--flag"]
    assert run["info"] == {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},  # no terminal here
    }
    assert run["cwd"] == str(path.parent)


def test_an_expired_token_is_fetched_again(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"token": "old", "expirationTimestamp": stamp(-dt.timedelta(seconds=1))})
    c = creds(write_kubeconfig({"server": "https://h"}, exec_user(plugin)))
    assert c.current()[0] == "Bearer old"
    credential(plugin, {"token": "new"})  # no expiry: valid until a 401
    assert c.current()[0] == "Bearer new"
    assert c.current()[0] == "Bearer new"
    assert len(runs(plugin)) == 2
    c.unauthorized()
    c.current()
    assert len(runs(plugin)) == 3


def test_cluster_info_when_asked(
    plugin: Path, write_kubeconfig: WriteKubeconfig, tmp_path: Path
) -> None:
    credential(plugin, {"token": "t"})
    (tmp_path / "ca.crt").write_bytes(b"CA")
    cluster = {
        "server": "https://h",
        "certificate-authority": "ca.crt",
        "tls-server-name": "api",
        "extensions": [
            {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "a"}},
            {"name": "someone-else", "extension": {"secret": "not for the plugin"}},
        ],
    }
    path = write_kubeconfig(cluster, exec_user(plugin, provideClusterInfo=True))
    creds(path).current()
    (run,) = runs(plugin)
    # client-go's ExecCredential Cluster: the CA as data, the exec extension as config.
    assert run["info"]["spec"]["cluster"] == {
        "server": "https://h",
        "tls-server-name": "api",
        "certificate-authority-data": "Q0E=",
        "config": {"audience": "a"},
    }


def test_failures_are_one_line(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    (plugin / "fail").touch()
    c = creds(write_kubeconfig({"server": "https://h"}, exec_user(plugin)))
    with pytest.raises(CredentialError) as exc:
        c.current()
    assert str(exc.value) == f"exec plugin {sys.executable}: process returned 3. login required"
    (plugin / "fail").unlink()
    credential(plugin, {"token": "t"}, api_version="client.authentication.k8s.io/v1beta1")
    with pytest.raises(CredentialError, match="does not match"):
        c.current()
    credential(plugin, {})
    with pytest.raises(CredentialError, match="neither a token nor a certificate"):
        c.current()
    (plugin / "cred.json").write_text("not json")
    with pytest.raises(CredentialError, match="failed to decode") as exc:
        c.current()
    assert "\n" not in str(exc.value)


def test_a_missing_plugin_names_its_install_hint(write_kubeconfig: WriteKubeconfig) -> None:
    user = {
        "exec": {
            "apiVersion": V1,
            "command": "/nonexistent/kubelogin",
            "installHint": "install kubelogin\nfrom its site",
        }
    }
    c = creds(write_kubeconfig({"server": "https://h"}, user))
    with pytest.raises(CredentialError, match=r"not found \(install kubelogin from its site\)"):
        c.current()


def test_a_failing_plugin_is_a_kube_error(api: FakeAPI, write_kubeconfig: WriteKubeconfig) -> None:
    user = {"exec": {"apiVersion": V1, "command": "false"}}
    kube = Kube.from_kubeconfig(str(write_kubeconfig({"server": api.url}, user)))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert (exc.value.status, exc.value.reason) == (0, "NoCredentials")
    assert "exec plugin false: process returned 1" in exc.value.message
    assert api.seen == []


def test_a_malformed_exec_section_is_a_config_error(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"exec": {"command": "x"}})
    with pytest.raises(KubeconfigError, match="missing key 'apiVersion'") as exc:
        config.load(str(path))
    assert f"kubeconfig {path}, user 'u'" in str(exc.value)


def test_a_token_refused_is_fetched_again_and_the_request_sent_once_more(
    api: FakeAPI, plugin: Path, write_kubeconfig: WriteKubeconfig
) -> None:
    credential(plugin, {"token": "revoked", "expirationTimestamp": stamp(HOUR)})
    cluster = {"server": api.url, "certificate-authority": str(api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, exec_user(plugin))))
    assert kube.get("/who")["auth"] == "Bearer revoked"
    api.deny.add("Bearer revoked")  # revoked before its expiry
    credential(plugin, {"token": "fresh"})  # what the next run prints
    assert kube.create("/who", {"a": 1})["auth"] == "Bearer fresh"
    assert [s.headers["Authorization"] for s in api.seen[1:]] == [
        "Bearer revoked",
        "Bearer fresh",
    ]
    assert [s.body for s in api.seen[1:]] == [b'{"a":1}'] * 2
    assert len(runs(plugin)) == 2
    # Refused again: sent once more only, then the 401 is the caller's.
    api.deny.add("Bearer fresh")
    with pytest.raises(KubeError) as exc:
        kube.get("/who")
    assert exc.value.status == 401
    assert len(api.seen) == 5 and len(runs(plugin)) == 3


def cert_status(pair: Pair, expires: dt.timedelta) -> dict[str, Any]:
    return {
        "clientCertificateData": pair.cert_pem.decode(),
        "clientKeyData": pair.key_pem.decode(),
        "expirationTimestamp": stamp(expires),
    }


def test_a_client_certificate_from_the_plugin_is_renewed_when_it_expires(
    mtls_api: FakeAPI,
    client_ca: TestCA,
    plugin: Path,
    write_kubeconfig: WriteKubeconfig,
) -> None:
    # Already expired: the plugin runs again for the next request.
    credential(plugin, cert_status(client_ca.issue("from-exec", server=False), -HOUR))
    cluster = {"server": mtls_api.url, "certificate-authority": str(mtls_api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, exec_user(plugin))))
    assert kube.get("/who")["cn"] == "from-exec"
    # The renewed certificate is presented at once: kept connections had the old one.
    credential(plugin, cert_status(client_ca.issue("renewed", server=False), HOUR))
    assert kube.get("/who")["cn"] == "renewed"
    assert kube.get("/who")["cn"] == "renewed"
    assert len(runs(plugin)) == 2
    kube.close()


def test_a_client_certificate_refused_is_fetched_again(
    mtls_api: FakeAPI,
    client_ca: TestCA,
    plugin: Path,
    write_kubeconfig: WriteKubeconfig,
) -> None:
    credential(plugin, cert_status(client_ca.issue("revoked", server=False), HOUR))
    cluster = {"server": mtls_api.url, "certificate-authority": str(mtls_api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, exec_user(plugin))))
    assert kube.get("/who")["cn"] == "revoked"
    mtls_api.deny.add("revoked")
    credential(plugin, cert_status(client_ca.issue("reissued", server=False), HOUR))
    assert kube.get("/who")["cn"] == "reissued"
    assert [s.client_cn for s in mtls_api.seen] == ["revoked", "revoked", "reissued"]
    assert len(runs(plugin)) == 2
    kube.close()


def test_a_half_certificate_is_refused(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"clientCertificateData": "C"})
    c = creds(write_kubeconfig({"server": "https://h"}, exec_user(plugin)))
    with pytest.raises(CredentialError, match="come together"):
        c.current()


@pytest.mark.parametrize("mode", ["Never", "IfAvailable", None])
def test_interactive_modes_a_daemon_can_use(
    plugin: Path, write_kubeconfig: WriteKubeconfig, mode: str | None
) -> None:
    credential(plugin, {"token": "t"})
    extra = {"interactiveMode": mode} if mode else {}
    c = creds(write_kubeconfig({"server": "https://h"}, exec_user(plugin, **extra)))
    assert c.current()[0] == "Bearer t"
    assert runs(plugin)[0]["info"]["spec"]["interactive"] is False


def test_interactive_mode_always_without_a_terminal_is_refused(
    plugin: Path, write_kubeconfig: WriteKubeconfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin, interactiveMode="Always"))
    with pytest.raises(KubeconfigError) as exc:
        config.load(str(path))
    message = str(exc.value)
    assert message.startswith(f"kubeconfig {path}, user 'u': the exec plugin {sys.executable}")
    assert "interactiveMode Always" in message and "no terminal" in message
    assert "set interactiveMode to IfAvailable or Never" in message
    assert runs(plugin) == []
    # At a terminal it is allowed.
    monkeypatch.setattr(exec_auth, "has_terminal", lambda: True)
    assert config.load(str(path)).exec is not None


def test_an_unknown_interactive_mode_is_refused(
    plugin: Path, write_kubeconfig: WriteKubeconfig
) -> None:
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin, interactiveMode="Often"))
    with pytest.raises(KubeconfigError, match="'Often' is not one of Never, IfAvailable, Always"):
        config.load(str(path))
