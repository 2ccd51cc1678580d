"""Kube over urllib3 against a local HTTPS server: keep-alive, errors, timeouts, 429s,
TLS settings, proxies and threads."""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.k8s import Conflict, Kube, KubeError, NotFound, client
from tests.support.k8s.certs import TestCA
from tests.support.k8s.fakeapi import FakeAPI
from tests.support.k8s.kubeconfig import WriteKubeconfig, configuration
from tests.support.k8s.proxy import ConnectProxy


def test_requests_reuse_a_kept_alive_connection(api: FakeAPI, kube: Kube) -> None:
    for _ in range(5):
        got = kube.get("/version")
        assert got["auth"] == "Bearer secret"
    assert len(api.connections()) == 1
    (first, *_) = api.seen
    assert first.headers["User-Agent"] == "dradriver"
    assert first.headers["Accept"] == "application/json"


def test_methods_bodies_and_queries(api: FakeAPI, kube: Kube) -> None:
    got = kube.create("/things", {"b": [1, 2], "a": "x"})
    # Compact, keys sorted: as Go encodes, so opaque parameters stay byte for byte what a
    # later PATCH or apply re-encodes.
    assert (got["method"], got["body"]) == ("POST", '{"a":"x","b":[1,2]}')
    assert got["contentType"] == "application/json"
    got = kube.patch("/things/x", [{"op": "remove", "path": "/a"}], patch_type="json")
    assert got["contentType"] == "application/json-patch+json"
    got = kube.patch("/things/x", {"a": None}, patch_type="strategic")
    assert got["contentType"] == "application/strategic-merge-patch+json"
    assert got["body"] == '{"a":null}'
    got = kube.apply("/things/x", {"a": 1}, field_manager="me")
    assert got["path"] == "/things/x?fieldManager=me&force=true"
    assert (got["contentType"], got["body"]) == ("application/apply-patch+yaml", '{"a":1}')
    got = kube.list("/things", labelSelector="a=b,c in (d)", limit=5, watch=False, x=None)
    assert got["path"] == "/things?labelSelector=a%3Db%2Cc%20in%20%28d%29&limit=5&watch=false"
    got = kube.delete("/things/x", grace_period=0, uid="u1")
    assert got["method"] == "DELETE"
    assert got["body"] == (
        '{"apiVersion":"v1","gracePeriodSeconds":0,"kind":"DeleteOptions",'
        '"preconditions":{"uid":"u1"}}'
    )
    assert kube.delete_collection("/things", labelSelector="a")["method"] == "DELETE"
    assert kube.get("/empty") == {}
    assert kube.text("/metrics") == "up 1\n"


def test_404_and_409_carry_the_status_message(kube: Kube) -> None:
    with pytest.raises(NotFound) as nf:
        kube.get("/missing")
    assert (nf.value.status, nf.value.reason) == (404, "NotFound")
    assert nf.value.message == 'widgets "x" not found'
    assert kube.delete("/missing", missing_ok=True) == {}
    with pytest.raises(Conflict) as conflict:
        kube.replace("/conflict", {})
    assert conflict.value.message == "the object has been modified"
    with pytest.raises(KubeError) as other:
        kube.get("/forbidden")
    assert (other.value.status, other.value.message) == (403, "<html>no</html>")
    assert not isinstance(other.value, NotFound | Conflict)


def test_errors_keep_the_connection(api: FakeAPI, kube: Kube) -> None:
    for _ in range(3):
        with pytest.raises(NotFound):
            kube.get("/missing")
    assert len(api.connections()) == 1


def test_a_timeout_is_an_unreachable_error(api: FakeAPI, kube: Kube) -> None:
    with pytest.raises(KubeError) as exc:
        kube.get("/slow", timeout=0.3)
    assert (exc.value.status, exc.value.reason) == (0, "Unreachable")
    assert "timed out" in exc.value.message
    assert "/slow" in exc.value.message
    assert api.paths().count("/slow") == 1  # one try, no hidden retries
    assert kube.get("/version")["method"] == "GET"  # the pool goes on


def test_a_connect_and_read_timeout_pair(api: FakeAPI, kube: Kube) -> None:
    with pytest.raises(KubeError, match="timed out"):
        kube.request("GET", "/slow", timeout=(5.0, 0.3))
    assert api.paths().count("/slow") == 1


def test_nobody_listening() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    kube = Kube(configuration(f"https://127.0.0.1:{port}", verify_ssl=False))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert (exc.value.status, exc.value.reason) == (0, "Unreachable")
    assert "refused" in exc.value.message
    assert "\n" not in exc.value.message


def test_a_server_that_never_answers() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    kube = Kube(configuration(f"http://127.0.0.1:{srv.getsockname()[1]}"))
    with pytest.raises(KubeError, match="timed out") as exc:
        kube.get("/version", timeout=0.5)
    assert exc.value.status == 0
    srv.close()


def test_an_idle_connection_closed_by_the_server_is_replaced(api: FakeAPI, kube: Kube) -> None:
    kube.get("/idle-close")  # answered, then closed: the client finds out when it reuses it
    assert api.closed.wait(5)
    assert kube.get("/version")["method"] == "GET"
    assert kube.create("/version", {})["method"] == "POST"  # not retried: looked at first
    assert len(api.connections()) == 2
    assert api.paths().count("/version") == 2


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_connection_that_closes_without_an_answer_is_not_retried(
    api: FakeAPI, kube: Kube, method: str
) -> None:
    kube.get("/version")
    with pytest.raises(KubeError) as exc:
        kube.request(method, "/flaky", body={} if method == "POST" else None)
    assert exc.value.status == 0
    assert "without response" in exc.value.message
    assert api.paths().count("/flaky") == 1


def test_a_429_is_retried_after_its_retry_after(
    api: FakeAPI, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(client, "_sleep", waits.append)
    api.busy, api.retry_after = 2, "3"
    assert kube.create("/busy", {"a": 1}) == {"ok": True}
    assert waits == [3.0, 3.0]
    assert api.paths().count("/busy") == 3
    assert [s.body for s in api.seen] == [b'{"a":1}'] * 3  # the same body each time
    # Without a Retry-After, a second.
    api.busy, api.retry_after = 1, None
    assert kube.get("/busy") == {"ok": True}
    assert waits[-1] == client.DEFAULT_RETRY_AFTER


def test_a_429_is_given_up_when_its_wait_would_pass_the_deadline(
    api: FakeAPI, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(client, "_sleep", waits.append)
    api.busy, api.retry_after = 5, "4"
    with pytest.raises(KubeError) as exc:
        kube.get("/busy", timeout=3.0)
    assert (exc.value.status, exc.value.reason, exc.value.message) == (
        429,
        "TooManyRequests",
        "slow down",
    )
    assert waits == [] and api.paths().count("/busy") == 1
    # A server asking for more than we wait inside a call is answered at once too.
    api.retry_after = str(int(client.MAX_RETRY_AFTER) + 1)
    with pytest.raises(KubeError):
        kube.get("/busy", timeout=120.0)
    assert waits == []


def test_a_429_retry_spends_from_the_same_deadline(
    api: FakeAPI, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(client.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(client, "_sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    api.busy, api.retry_after = 3, "4"
    with pytest.raises(KubeError) as exc:
        kube.get("/busy", timeout=10.0)  # waits 4, 4: a third wait would end at 12
    assert exc.value.status == 429
    assert api.paths().count("/busy") == 3
    assert clock[0] == 1008.0


def test_threads_share_the_pool(api: FakeAPI, kube: Kube) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for j in range(15):
                got = kube.get(f"/t{i}", n=j)
                assert got["path"] == f"/t{i}?n={j}", got
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert len(api.seen) == 8 * 15
    assert len(api.connections()) <= 8  # one per concurrent request at most, then reused


def test_untrusted_server_certificate(api: FakeAPI, tmp_path: Path) -> None:
    other = tmp_path / "other.crt"
    other.write_bytes(TestCA("someone else").pem)
    kube = Kube(configuration(api.url, ssl_ca_cert=str(other)))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert exc.value.status == 0
    assert "CERTIFICATE_VERIFY_FAILED" in exc.value.message


def test_ca_data_insecure_and_tls_server_name(
    api: FakeAPI, write_kubeconfig: WriteKubeconfig
) -> None:
    ca = base64.b64encode(api.ca.pem).decode()
    by_data = write_kubeconfig({"server": api.url, "certificate-authority-data": ca})
    assert Kube.from_kubeconfig(str(by_data)).get("/version")
    insecure = write_kubeconfig({"server": api.url, "insecure-skip-tls-verify": True})
    with pytest.warns(Warning, match="Unverified HTTPS request"):  # urllib3 says so
        assert Kube.from_kubeconfig(str(insecure)).get("/version")
    # The certificate names 127.0.0.1 and localhost, not "elsewhere".
    for name, works in (("elsewhere", False), ("localhost", True)):
        path = write_kubeconfig(
            {"server": api.url, "certificate-authority-data": ca, "tls-server-name": name}
        )
        kube = Kube.from_kubeconfig(str(path))
        if works:
            assert kube.get("/version")
        else:
            with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
                kube.get("/version")


def test_client_certificates_from_data_and_files(
    mtls_api: FakeAPI, client_ca: TestCA, tmp_path: Path, write_kubeconfig: WriteKubeconfig
) -> None:
    pair = client_ca.issue("by-data", server=False)
    user = {
        "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
        "client-key-data": base64.b64encode(pair.key_pem).decode(),
    }
    cluster = {
        "server": mtls_api.url,
        "certificate-authority-data": base64.b64encode(mtls_api.ca.pem).decode(),
    }
    kube = Kube.from_kubeconfig(str(write_kubeconfig(cluster, user)))
    assert kube.get("/who")["cn"] == "by-data"
    # Someone else's token, and no certificate: the server must not see the kubeconfig's.
    as_sa = kube.with_token("sa-token")
    got = as_sa.get("/who")
    assert (got["cn"], got["auth"]) == (None, "Bearer sa-token")

    cert, key = client_ca.issue("by-file", server=False).write(tmp_path, "client")
    by_file = Kube(
        configuration(
            mtls_api.url, ssl_ca_cert=str(mtls_api.ca_file), cert_file=str(cert), key_file=str(key)
        )
    )
    assert by_file.get("/who")["cn"] == "by-file"


def test_a_bad_client_key_names_the_file(api: FakeAPI, tmp_path: Path) -> None:
    (tmp_path / "c.crt").write_text("not a cert")
    (tmp_path / "c.key").write_text("not a key")
    kube = Kube(
        configuration(
            api.url,
            ssl_ca_cert=str(api.ca_file),
            cert_file=str(tmp_path / "c.crt"),
            key_file=str(tmp_path / "c.key"),
        )
    )
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert exc.value.status == 0
    assert f"client certificate {tmp_path / 'c.crt'}" in exc.value.message


def test_plain_http_and_a_path_prefix(tmp_path: Path) -> None:
    srv = FakeAPI(tmp_path, tls=False)
    try:
        kube = Kube(configuration(srv.url + "/k8s/clusters/c1/"))
        assert kube.get("/api/v1/pods")["path"] == "/k8s/clusters/c1/api/v1/pods"
        assert kube.host == srv.url + "/k8s/clusters/c1"
    finally:
        srv.close()


def test_an_official_api_client_is_still_accepted(api: FakeAPI) -> None:
    from kubernetes import client as kclient

    cfg = configuration(api.url, ssl_ca_cert=str(api.ca_file))
    cfg.api_key = {"BearerToken": "Bearer from-official"}
    kube = Kube(kclient.ApiClient(cfg))
    assert kube.get("/version")["auth"] == "Bearer from-official"
    assert kube.with_token("t").get("/version")["auth"] == "Bearer t"


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    p = ConnectProxy()
    yield p
    p.close()


def test_through_the_kubeconfigs_proxy(
    api: FakeAPI,
    proxy: ConnectProxy,
    write_kubeconfig: WriteKubeconfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NO_PROXY is for the environment's proxy: the kubeconfig's is used whatever it says.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    path = write_kubeconfig(
        {"server": api.url, "certificate-authority": str(api.ca_file), "proxy-url": proxy.url}
    )
    kube = Kube.from_kubeconfig(str(path))
    assert kube.get("/version")["path"] == "/version"  # TLS to the server, inside
    assert kube.get("/version")["path"] == "/version"
    assert proxy.tunnels == [api.url.removeprefix("https://")]  # one kept-alive tunnel
    kube.close()


def test_https_proxy_from_the_environment(
    api: FakeAPI,
    proxy: ConnectProxy,
    write_kubeconfig: WriteKubeconfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    path = write_kubeconfig({"server": api.url, "certificate-authority": str(api.ca_file)})
    assert Kube.from_kubeconfig(str(path)).get("/version")["path"] == "/version"
    assert proxy.tunnels == [api.url.removeprefix("https://")]
    # NO_PROXY names the server: straight to it.
    monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.0/8")
    assert Kube.from_kubeconfig(str(path)).get("/version")["path"] == "/version"
    assert len(proxy.tunnels) == 1
    assert len(api.seen) == 2


def test_a_proxy_that_refuses_the_tunnel(
    api: FakeAPI, proxy: ConnectProxy, write_kubeconfig: WriteKubeconfig
) -> None:
    proxy.refuse = True
    path = write_kubeconfig(
        {"server": api.url, "certificate-authority": str(api.ca_file), "proxy-url": proxy.url}
    )
    with pytest.raises(KubeError) as exc:
        Kube.from_kubeconfig(str(path)).get("/version")
    assert exc.value.status == 0
    assert "proxy" in exc.value.message.lower()
    assert api.seen == []


def test_the_pool_keeps_32_connections_and_never_retries(api: FakeAPI, kube: Kube) -> None:
    kube.get("/version")
    _, pool, _ = kube._transport._pool or ()
    assert pool.pool is not None and pool.pool.maxsize == 32
    assert pool.retries is not None and pool.retries.total is False  # type: ignore[union-attr]
