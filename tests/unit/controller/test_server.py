"""The webhook over real TLS on 127.0.0.1: what the API server sees, and what it survives."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dradriver.controller import server, tls
from tests.support.admission import BAD, GOOD, claim_obj, review

DRIVER = "gpu.dradriver.io"


@pytest.fixture
def webhook() -> Iterator[tuple[server.Server, ssl.SSLContext]]:
    serving = tls.SelfSignedTLS(tls.serving_names("ctl", "drv"))
    ready = {"caBundle": lambda: (False, "validatingwebhookconfiguration adm not found")}
    srv = server.Server(
        "127.0.0.1",
        0,
        checks={"process": lambda: (True, "serving")},
        ready=ready,
        validate=lambda body: server.review(body, DRIVER),
        tls=lambda: serving.context,
    )
    srv.start()
    # Trust only our CA, and check the name as the API server does for a url webhook.
    client = ssl.create_default_context(cadata=(serving.ca_pem or b"").decode())
    yield srv, client
    srv.stop()
    serving.close()


def call(
    srv: server.Server, client: ssl.SSLContext, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes, str]:
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client, timeout=5)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type", "")
    finally:
        conn.close()


def test_reviews_answered_with_the_same_uid(webhook: Any) -> None:
    srv, client = webhook
    status, body, ctype = call(srv, client, "POST", "/validate?timeout=10s", review(claim_obj(BAD)))
    assert (status, ctype) == (200, "application/json")
    resp = json.loads(body)["response"]
    assert resp["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and resp["allowed"] is False
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in resp["status"]["message"]
    status, body, _ = call(srv, client, "POST", "/validate", review(claim_obj(GOOD)))
    assert json.loads(body)["response"]["allowed"] is True


def test_malformed_bodies_get_400_and_the_server_keeps_serving(webhook: Any) -> None:
    srv, client = webhook
    for bad in (b"{not json", b"[]", b'{"apiVersion": "admission.k8s.io/v1"}', b"\x00" * 10):
        status, body, _ = call(srv, client, "POST", "/validate", bad)
        assert status == 400 and body.startswith(b"malformed AdmissionReview:")
    status, _, _ = call(srv, client, "POST", "/elsewhere", b"{}")
    assert status == 404
    status, body, _ = call(srv, client, "POST", "/validate", review(claim_obj(GOOD)))
    assert status == 200 and json.loads(body)["response"]["allowed"] is True


def test_health_and_readiness(webhook: Any) -> None:
    srv, client = webhook
    assert call(srv, client, "GET", "/healthz")[0] == 200
    status, body, _ = call(srv, client, "GET", "/readyz")
    assert status == 503
    assert json.loads(body)["caBundle"] == {
        "ok": False,
        "detail": "validatingwebhookconfiguration adm not found",
    }


def raw_request(srv: server.Server, client: ssl.SSLContext, head: bytes) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", srv.port)) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        s.sendall(head)
        return s.recv(100)


def test_bodies_without_length_or_too_large_are_refused(webhook: Any) -> None:
    srv, client = webhook
    huge = f"POST /validate HTTP/1.1\r\nContent-Length: {1 << 30}\r\n\r\n".encode()
    assert raw_request(srv, client, huge).startswith(b"HTTP/1.0 413")
    assert raw_request(srv, client, b"POST /validate HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 411")


def test_silent_and_untrusting_clients_do_not_stall_others(webhook: Any) -> None:
    srv, client = webhook
    silent = socket.create_connection(("127.0.0.1", srv.port))  # never says hello
    plain = socket.create_connection(("127.0.0.1", srv.port))
    plain.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")  # not TLS at all
    untrusting = ssl.create_default_context()  # does not know our CA
    with pytest.raises(ssl.SSLCertVerificationError):
        call(srv, untrusting, "GET", "/healthz")
    try:
        start = time.monotonic()
        assert call(srv, client, "GET", "/healthz")[0] == 200
        assert time.monotonic() - start < 2
    finally:
        silent.close()
        plain.close()


def test_plain_http_probe_server_has_no_validate() -> None:
    srv = server.Server("127.0.0.1", 0, checks={"process": lambda: (True, "ok")}, ready={})
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 200
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
        conn.request("POST", "/validate", body=review(claim_obj(GOOD)))
        assert conn.getresponse().status == 404
        conn.close()
    finally:
        srv.stop()
