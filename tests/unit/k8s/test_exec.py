"""client-go exec credential plugins: run with the kubeconfig's args and env and
KUBERNETES_EXEC_INFO, their token or certificate used, cached until it expires."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, KubeError, config
from dradriver.k8s.auth import Credentials
from dradriver.k8s.errors import CredentialError
from tests.unit.k8s.certs import Pair, TestCA
from tests.unit.k8s.conftest import WriteKubeconfig
from tests.unit.k8s.fakeapi import FakeAPI

V1 = "client.authentication.k8s.io/v1"
HOUR = dt.timedelta(hours=1)

# Prints the ExecCredential in $CRED (a file), after noting each run and its input.
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


@pytest.mark.parametrize("api_version", [V1, "client.authentication.k8s.io/v1beta1"])
def test_a_token_is_cached_until_it_expires(
    plugin: Path, write_kubeconfig: WriteKubeconfig, api_version: str
) -> None:
    credential(
        plugin, {"token": "t1", "expirationTimestamp": stamp(dt.timedelta(hours=1))}, api_version
    )
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin, api_version))
    creds = Credentials(config.load(str(path)))
    assert creds.current() == ("Bearer t1", None)
    assert creds.current() == ("Bearer t1", None)
    (run,) = runs(plugin)
    assert run["args"] == ["--flag"]
    assert run["info"] == {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    assert run["cwd"] == str(path.parent)


def test_an_expired_token_is_fetched_again(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"token": "old", "expirationTimestamp": stamp(-dt.timedelta(seconds=1))})
    creds = Credentials(
        config.load(str(write_kubeconfig({"server": "https://h"}, exec_user(plugin))))
    )
    assert creds.current()[0] == "Bearer old"
    credential(plugin, {"token": "new"})  # no expiry: valid until a 401
    assert creds.current()[0] == "Bearer new"
    assert creds.current()[0] == "Bearer new"
    assert len(runs(plugin)) == 2
    creds.unauthorized()
    creds.current()
    assert len(runs(plugin)) == 3


def test_cluster_info_when_asked(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"token": "t"})
    cluster = {
        "server": "https://h",
        "certificate-authority-data": "Q0E=",
        "extensions": [
            {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "a"}}
        ],
    }
    path = write_kubeconfig(cluster, exec_user(plugin, provideClusterInfo=True))
    Credentials(config.load(str(path))).current()
    (run,) = runs(plugin)
    assert run["info"]["spec"]["cluster"] == {
        "server": "https://h",
        "certificate-authority-data": "Q0E=",
        "config": {"audience": "a"},
    }


def test_failures_are_one_line(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    (plugin / "fail").touch()
    creds = Credentials(
        config.load(str(write_kubeconfig({"server": "https://h"}, exec_user(plugin))))
    )
    with pytest.raises(CredentialError, match="exit status 3: login required"):
        creds.current()
    (plugin / "fail").unlink()
    credential(plugin, {"token": "t"}, api_version="client.authentication.k8s.io/v1beta1")
    with pytest.raises(CredentialError, match="answered apiVersion"):
        creds.current()
    credential(plugin, {})
    with pytest.raises(CredentialError, match="neither a token nor a certificate"):
        creds.current()


def test_a_missing_plugin_names_its_install_hint(write_kubeconfig: WriteKubeconfig) -> None:
    user = {
        "exec": {
            "apiVersion": V1,
            "command": "/nonexistent/kubelogin",
            "installHint": "install kubelogin\nfrom its site",
        }
    }
    creds = Credentials(config.load(str(write_kubeconfig({"server": "https://h"}, user))))
    with pytest.raises(CredentialError, match=r"not found \(install kubelogin from its site\)"):
        creds.current()


def test_a_failing_plugin_is_a_kube_error(api: FakeAPI, write_kubeconfig: WriteKubeconfig) -> None:
    user = {"exec": {"apiVersion": V1, "command": "false"}}
    kube = Kube.from_kubeconfig(str(write_kubeconfig({"server": api.url}, user)))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert exc.value.status == 0
    assert "exec plugin false: exit status 1" in exc.value.message


def cert_status(pair: Pair, expires: dt.timedelta) -> dict[str, Any]:
    return {
        "clientCertificateData": pair.cert_pem.decode(),
        "clientKeyData": pair.key_pem.decode(),
        "expirationTimestamp": stamp(expires),
    }


def test_a_client_certificate_from_the_plugin(
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


def test_a_half_certificate_is_refused(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"clientCertificateData": "C"})
    creds = Credentials(
        config.load(str(write_kubeconfig({"server": "https://h"}, exec_user(plugin))))
    )
    with pytest.raises(CredentialError, match="come together"):
        creds.current()


def test_an_old_protocol_version_goes_to_the_official_library(
    plugin: Path, write_kubeconfig: WriteKubeconfig
) -> None:
    alpha = "client.authentication.k8s.io/v1alpha1"
    credential(plugin, {"token": "from-official"}, api_version=alpha)
    cfg = config.load(str(write_kubeconfig({"server": "https://h"}, exec_user(plugin, alpha))))
    assert cfg.legacy is not None and cfg.exec is None
    assert Credentials(cfg).current() == ("Bearer from-official", None)
