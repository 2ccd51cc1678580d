"""Kube over the stdlib transport against a local HTTPS server: keep-alive, errors,
timeouts, watch streams, TLS settings and threads."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.k8s import Conflict, Kube, KubeError, NotFound, transport
from dradriver.k8s.config import ClientCert, KubeConfig
from tests.unit.k8s.certs import TestCA
from tests.unit.k8s.conftest import WriteKubeconfig
from tests.unit.k8s.fakeapi import FakeAPI


@pytest.fixture
def kube(api: FakeAPI) -> Iterator[Kube]:
    k = Kube(KubeConfig(server=api.url, ca_file=str(api.ca_file), token="secret"))
    yield k
    k.close()


def connections(api: FakeAPI) -> set[tuple[str, int]]:
    with api.lock:
        return {s.conn for s in api.seen}


def test_requests_reuse_a_kept_alive_connection(api: FakeAPI, kube: Kube) -> None:
    for _ in range(5):
        assert kube.get("/version")["auth"] == "Bearer secret"
    assert len(connections(api)) == 1


def test_methods_bodies_and_queries(api: FakeAPI, kube: Kube) -> None:
    got = kube.create("/things", {"b": [1, 2], "a": "x"})
    assert (got["method"], got["body"]) == ("POST", '{"b":[1,2],"a":"x"}')  # compact
    assert got["contentType"] == "application/json"
    got = kube.patch("/things/x", [{"op": "remove", "path": "/a"}], patch_type="json")
    assert got["contentType"] == "application/json-patch+json"
    got = kube.apply("/things/x", {"a": 1}, field_manager="me")
    assert got["path"] == "/things/x?fieldManager=me&force=true"
    assert got["contentType"] == "application/apply-patch+yaml"
    got = kube.list("/things", labelSelector="a=b,c in (d)", limit=5, watch=False, x=None)
    assert got["path"] == "/things?labelSelector=a%3Db%2Cc%20in%20%28d%29&limit=5&watch=false"
    got = kube.delete("/things/x", grace_period=0, uid="u1")
    assert got["method"] == "DELETE"
    assert got["body"] == (
        '{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0,'
        '"preconditions":{"uid":"u1"}}'
    )
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
    assert len(connections(api)) == 1


def test_a_timeout_is_an_unreachable_error(api: FakeAPI, kube: Kube) -> None:
    start = time.monotonic()
    with pytest.raises(KubeError) as exc:
        kube.get("/slow", timeout=0.3)
    assert time.monotonic() - start < 1.5  # one try, no hidden retries
    assert (exc.value.status, exc.value.reason) == (0, "Unreachable")
    assert "timed out" in exc.value.message
    assert api.paths().count("/slow") == 1
    assert kube.get("/version")["method"] == "GET"  # the pool goes on


def test_a_connect_and_read_timeout_pair(kube: Kube) -> None:
    with pytest.raises(KubeError, match="timed out"):
        kube.request("GET", "/slow", timeout=(5.0, 0.3))


def test_nobody_listening(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    kube = Kube(KubeConfig(server=f"https://127.0.0.1:{port}", insecure=True))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert (exc.value.status, exc.value.reason) == (0, "Unreachable")
    assert "refused" in exc.value.message


def test_a_server_that_never_answers() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    kube = Kube(KubeConfig(server=f"http://127.0.0.1:{srv.getsockname()[1]}"))
    start = time.monotonic()
    with pytest.raises(KubeError, match="timed out"):
        kube.get("/version", timeout=0.5)
    assert time.monotonic() - start < 1.5
    srv.close()


def test_an_idle_connection_closed_by_the_server_is_replaced(api: FakeAPI, kube: Kube) -> None:
    kube.get("/idle-close")  # answered, then closed: the client finds out when it reuses it
    time.sleep(0.1)
    assert kube.get("/version")["method"] == "GET"
    assert len(connections(api)) == 2


def test_a_post_finds_a_closed_idle_connection_before_using_it(api: FakeAPI, kube: Kube) -> None:
    kube.get("/idle-close")
    time.sleep(0.1)
    assert kube.create("/version", {})["method"] == "POST"  # not retried: looked first
    assert len(connections(api)) == 2


def test_only_requests_that_are_retried_skip_the_look_on_a_recent_connection(
    api: FakeAPI, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    real = transport._Conn.dropped
    monkeypatch.setattr(transport._Conn, "dropped", lambda c: looks.append(1) or real(c))
    kube.get("/version")
    kube.get("/version")  # reused within the second: a stale one is retried instead
    assert looks == []
    kube.create("/version", {})
    assert looks == [1]
    monkeypatch.setattr(transport, "RECENT_SECONDS", 0.0)
    kube.get("/version")
    assert looks == [1, 1]


def test_a_get_on_a_stale_connection_is_retried_once(api: FakeAPI, kube: Kube) -> None:
    kube.get("/version")
    assert kube.get("/flaky") == {"hits": 2}  # the first try found the connection closed
    assert api.paths().count("/flaky") == 2


def test_a_post_on_a_stale_connection_is_not_retried(api: FakeAPI, kube: Kube) -> None:
    kube.get("/version")
    with pytest.raises(KubeError) as exc:
        kube.create("/flaky", {})
    assert exc.value.status == 0
    assert api.paths().count("/flaky") == 1


def test_a_fresh_connection_is_not_retried(api: FakeAPI, kube: Kube) -> None:
    with pytest.raises(KubeError):
        kube.get("/flaky")
    assert api.paths().count("/flaky") == 1


def test_watch_streams_events_as_they_come(api: FakeAPI, kube: Kube) -> None:
    api.watch_events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"s{i}", "resourceVersion": str(i)}}}
        for i in range(4)
    ] + [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]
    stream = kube.watch("/watch", resource_version="3", timeout_seconds=5, fieldSelector="a=b")
    first = next(stream)
    # The server holds the rest back until we have the first: it came as a stream.
    assert first["object"]["metadata"]["name"] == "s0"
    api.watch_gate.set()
    rest = list(stream)
    assert [e["type"] for e in rest] == ["ADDED"] * 3 + ["BOOKMARK"]
    (seen,) = [s for s in api.seen if s.path.startswith("/watch")]
    assert seen.path == (
        "/watch?fieldSelector=a%3Db&watch=true&timeoutSeconds=5"
        "&allowWatchBookmarks=true&resourceVersion=3"
    )
    # The stream ended cleanly: its connection serves the next request.
    kube.get("/version")
    assert len(connections(api)) == 1


def test_watch_error_events_raise(api: FakeAPI, kube: Kube) -> None:
    api.watch_gate.set()
    api.watch_events = [
        {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
    ]
    with pytest.raises(KubeError) as exc:
        list(kube.watch("/watch"))
    assert (exc.value.status, exc.value.reason, exc.value.message) == (410, "Expired", "too old")


def test_a_watch_left_early_closes_its_connection(api: FakeAPI, kube: Kube) -> None:
    api.watch_events = [{"type": "ADDED", "object": {}}] * 3
    stream = kube.watch("/watch")
    next(stream)
    stream.close()
    api.watch_gate.set()
    kube.get("/version")
    assert len(connections(api)) == 2  # the half-read stream was not reused


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
    assert len(connections(api)) <= 8  # one per concurrent request at most, then reused


def test_untrusted_server_certificate(api: FakeAPI) -> None:
    other = TestCA("someone else")
    kube = Kube(KubeConfig(server=api.url, ca_data=other.pem))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert exc.value.status == 0
    assert "CERTIFICATE_VERIFY_FAILED" in exc.value.message


def test_ca_data_insecure_and_tls_server_name(api: FakeAPI) -> None:
    assert Kube(KubeConfig(server=api.url, ca_data=api.ca.pem)).get("/version")
    assert Kube(KubeConfig(server=api.url, insecure=True)).get("/version")
    # The certificate names 127.0.0.1 and localhost, not "elsewhere".
    wrong = Kube(KubeConfig(server=api.url, ca_data=api.ca.pem, tls_server_name="elsewhere"))
    with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
        wrong.get("/version")
    right = Kube(KubeConfig(server=api.url, ca_data=api.ca.pem, tls_server_name="localhost"))
    assert right.get("/version")


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
        KubeConfig(
            server=mtls_api.url,
            ca_file=str(mtls_api.ca_file),
            client_cert=ClientCert(cert_file=str(cert), key_file=str(key)),
        )
    )
    assert by_file.get("/who")["cn"] == "by-file"


def test_a_bad_client_key_is_an_error_not_a_crash(api: FakeAPI) -> None:
    bad = ClientCert(cert_pem=b"not a cert", key_pem=b"not a key")
    kube = Kube(KubeConfig(server=api.url, ca_file=str(api.ca_file), client_cert=bad))
    with pytest.raises(KubeError) as exc:
        kube.get("/version")
    assert exc.value.status == 0
    assert "TLS setup" in exc.value.message


def test_plain_http_and_a_path_prefix(tmp_path: Path) -> None:
    srv = FakeAPI(tmp_path, tls=False)
    try:
        kube = Kube(KubeConfig(server=srv.url + "/k8s/clusters/c1"))
        assert kube.get("/api/v1/pods")["path"] == "/k8s/clusters/c1/api/v1/pods"
        assert kube.host == srv.url + "/k8s/clusters/c1"
    finally:
        srv.close()


def test_an_official_api_client_is_still_accepted(api: FakeAPI) -> None:
    from kubernetes import client as kclient

    cfg = kclient.Configuration()
    cfg.host = api.url
    cfg.ssl_ca_cert = str(api.ca_file)
    cfg.api_key = {"BearerToken": "Bearer from-official"}
    kube = Kube(kclient.ApiClient(cfg))
    assert kube.get("/version")["auth"] == "Bearer from-official"
    assert kube.with_token("t").get("/version")["auth"] == "Bearer t"


class ConnectProxy:
    """An HTTP CONNECT proxy that notes each tunnel it opens."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(4096)
        target = head.split()[1].decode()
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        dst.close()


def test_through_a_connect_proxy(api: FakeAPI) -> None:
    proxy = ConnectProxy()
    try:
        kube = Kube(KubeConfig(server=api.url, ca_file=str(api.ca_file), proxy_url=proxy.url))
        assert kube.get("/version")["path"] == "/version"  # TLS to the server, inside
        assert kube.get("/version")["path"] == "/version"
        assert proxy.tunnels == [api.url.removeprefix("https://")]  # one kept-alive tunnel
        kube.close()
    finally:
        proxy.close()


def test_in_cluster_with_a_rotating_token(
    api: FakeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dradriver.k8s import config

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(api.ca.pem)
    (sa / "token").write_text("first")
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", api.url.rsplit(":", 1)[1])
    kube = Kube.from_kubeconfig(None)
    assert kube.host == api.url
    assert kube.get("/version")["auth"] == "Bearer first"
    (sa / "token").write_text("second")
    assert kube.get("/version")["auth"] == "Bearer second"
    kube.close()


def test_a_kubeconfig_ca_is_the_only_one_trusted(tmp_path: Path) -> None:
    """As client-go: a CA in the kubeconfig replaces the system's roots (and loading
    those cost the plugin's first API call 50 ms)."""
    from dradriver.k8s.transport import _build_ssl_context

    ca = TestCA("only this CA")
    for cfg in (
        KubeConfig(server="https://x", ca_data=ca.pem),
        KubeConfig(server="https://x", ca_file=str(_write(tmp_path / "ca.crt", ca.pem))),
    ):
        ctx = _build_ssl_context(cfg, None)
        assert [dict(c["subject"][0])["commonName"] for c in ctx.get_ca_certs()] == ["only this CA"]
        assert ctx.check_hostname and ctx.verify_mode.name == "CERT_REQUIRED"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
