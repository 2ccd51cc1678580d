"""client-go exec credential plugins, run by the official library: at load, with the
kubeconfig's args, env and KUBERNETES_EXEC_INFO, and again from its refresh hook when the
token expires; a plugin that is missing or fails is one error naming it."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dradriver.k8s import Kube, KubeconfigError, KubeError, auth, config
from dradriver.k8s.auth import Credentials
from tests.support.k8s.certs import TestCA
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig

V1 = "client.authentication.k8s.io/v1"
HOUR = dt.timedelta(hours=1)

# Prints the ExecCredential in cred.json, after noting each run and its input.
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


def hours_pass(monkeypatch: pytest.MonkeyPatch, hours: int) -> None:
    """As if `hours` went by, for the library's expiry check: it renews a token when
    now + EXPIRY_SKEW_PREVENTION_DELAY reaches its expirationTimestamp."""
    from kubernetes.config import kube_config

    monkeypatch.setattr(kube_config, "EXPIRY_SKEW_PREVENTION_DELAY", hours * HOUR)


@pytest.mark.parametrize(
    "api_version",
    [V1, "client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1alpha1"],
)
def test_the_plugin_runs_at_load_with_the_kubeconfigs_settings(
    plugin: Path, write_kubeconfig: WriteKubeconfig, api_version: str
) -> None:
    credential(plugin, {"token": "t1", "expirationTimestamp": stamp(HOUR)}, api_version)
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin, api_version))
    c = Credentials(config.load(str(path)).configuration)
    assert c.authorization() == "Bearer t1"
    (run,) = runs(plugin)
    assert run["args"] == ["--flag"]
    assert run["info"] == {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},  # no terminal here
    }
    assert run["cwd"] == str(path.parent)


def test_a_token_is_renewed_when_it_expires(
    api: FakeAPI,
    plugin: Path,
    write_kubeconfig: WriteKubeconfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "RECHECK_SECONDS", 0.0)  # the refresh hook on every request
    credential(plugin, {"token": "first", "expirationTimestamp": stamp(HOUR)})
    cluster = {"server": api.url, "certificate-authority": str(api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, exec_user(plugin))))
    credential(plugin, {"token": "second", "expirationTimestamp": stamp(3 * HOUR)})
    assert kube.get("/who")["auth"] == "Bearer first"
    assert kube.get("/who")["auth"] == "Bearer first"  # kept until it expires
    hours_pass(monkeypatch, 2)
    assert kube.get("/who")["auth"] == "Bearer second"
    assert kube.get("/who")["auth"] == "Bearer second"
    assert len(runs(plugin)) == 2
    kube.close()


def test_a_renewal_that_fails_is_a_kube_error(
    api: FakeAPI,
    plugin: Path,
    write_kubeconfig: WriteKubeconfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    credential(plugin, {"token": "t", "expirationTimestamp": stamp(HOUR)})
    kube = Kube.from_kubeconfig(str(write_kubeconfig({"server": api.url}, exec_user(plugin))))
    (plugin / "fail").touch()
    hours_pass(monkeypatch, 2)
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert (exc.value.status, exc.value.reason) == (0, "NoCredentials")
    assert f"exec plugin {sys.executable}: process returned 3. login required" in str(exc.value)
    assert api.seen == []  # never sent without its credential


def test_failures_at_load_are_one_line(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, exec_user(plugin))
    (plugin / "fail").touch()
    with pytest.raises(KubeconfigError) as exc:
        config.load(str(path))
    assert str(exc.value) == (
        f"kubeconfig {path}, user 'u': exec plugin {sys.executable}: "
        "process returned 3. login required"
    )
    (plugin / "fail").unlink()
    credential(plugin, {"token": "t"}, api_version="client.authentication.k8s.io/v1beta1")
    with pytest.raises(KubeconfigError, match="does not match"):
        config.load(str(path))
    credential(plugin, {})
    with pytest.raises(KubeconfigError, match="missing token or clientCertificateData"):
        config.load(str(path))
    credential(plugin, {"clientCertificateData": "C"})
    with pytest.raises(KubeconfigError, match="missing clientKeyData"):
        config.load(str(path))
    (plugin / "cred.json").write_text("not json")
    with pytest.raises(KubeconfigError, match="failed to decode") as exc:
        config.load(str(path))
    assert "\n" not in str(exc.value)


def test_a_missing_plugin_names_its_install_hint(write_kubeconfig: WriteKubeconfig) -> None:
    user = {
        "exec": {
            "apiVersion": V1,
            "command": "/nonexistent/kubelogin",
            "installHint": "install kubelogin\nfrom its site",
        }
    }
    path = write_kubeconfig({"server": "https://h"}, user)
    with pytest.raises(KubeconfigError) as exc:
        config.load(str(path))
    assert str(exc.value) == (
        f"kubeconfig {path}, user 'u': exec plugin /nonexistent/kubelogin: "
        "not found (install kubelogin from its site)"
    )
    user["exec"]["command"] = "no-such-plugin-on-the-path"
    with pytest.raises(KubeconfigError, match="no-such-plugin-on-the-path: not found"):
        config.load(str(write_kubeconfig({"server": "https://h"}, user)))


def test_a_malformed_exec_section_is_a_config_error(write_kubeconfig: WriteKubeconfig) -> None:
    path = write_kubeconfig({"server": "https://h"}, {"exec": {"command": "x"}})
    with pytest.raises(KubeconfigError, match="missing key 'apiVersion'") as exc:
        config.load(str(path))
    assert f"kubeconfig {path}, user 'u'" in str(exc.value)


def test_a_client_certificate_from_the_plugin(
    mtls_api: FakeAPI, client_ca: TestCA, plugin: Path, write_kubeconfig: WriteKubeconfig
) -> None:
    pair = client_ca.issue("from-exec", server=False)
    status = {
        "clientCertificateData": pair.cert_pem.decode(),
        "clientKeyData": pair.key_pem.decode(),
    }
    credential(plugin, status)
    cluster = {"server": mtls_api.url, "certificate-authority": str(mtls_api.ca_file)}
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, exec_user(plugin))))
    assert kube.get("/who")["cn"] == "from-exec"
    kube.close()


def test_cluster_info_when_asked(plugin: Path, write_kubeconfig: WriteKubeconfig) -> None:
    credential(plugin, {"token": "t"})
    cluster = {
        "server": "https://h",
        "extensions": [
            {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "a"}},
        ],
    }
    config.load(str(write_kubeconfig(cluster, exec_user(plugin, provideClusterInfo=True))))
    (run,) = runs(plugin)
    info = run["info"]["spec"]["cluster"]
    assert (info["server"], info["config"]) == ("https://h", {"audience": "a"})
