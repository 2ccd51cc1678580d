"""What a hostile or broken caller cannot get from the webhook server: more threads than
its slots, a slot held past the deadline, or our exception's text."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from dradriver import logs
from dradriver.controller import admission, server, tls
from tests.support.admission import GOOD, claim_obj, review

DRIVER = "gpu.dradriver.io"


@pytest.fixture
def serving() -> Iterator[tls.SelfSignedTLS]:
    s = tls.SelfSignedTLS(tls.serving_names("ctl", "drv"))
    yield s
    s.close()


def webhook(serving: tls.SelfSignedTLS, **limits: float) -> server.Server:
    srv = server.Server(
        "127.0.0.1",
        0,
        checks={"process": lambda: (True, "serving")},
        ready={},
        validate=lambda body: server.review(body, DRIVER),
        tls=lambda: serving.context,
        **limits,  # type: ignore[arg-type]
    )
    srv.start()
    return srv


def call(srv: server.Server, serving: tls.SelfSignedTLS) -> tuple[int, bytes]:
    client = ssl.create_default_context(cadata=(serving.ca_pem or b"").decode())
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client, timeout=10)
    try:
        conn.request("POST", "/validate", body=review(claim_obj(GOOD)))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def idle(srv: server.Server, n: int) -> list[socket.socket]:
    """Connections that never say hello, as a slowloris peer opens them."""
    return [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(n)]


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_past_the_cap_start_no_more_threads(
    serving: tls.SelfSignedTLS,
) -> None:
    srv = webhook(serving)
    before = threading.active_count()
    peers = idle(srv, 3 * server.MAX_CONNECTIONS)
    try:
        time.sleep(0.5)  # every connection accepted that will be
        assert threading.active_count() - before <= server.MAX_CONNECTIONS
    finally:
        for p in peers:
            p.close()
        srv.stop()


def test_a_call_is_answered_once_the_deadline_frees_a_slot(serving: tls.SelfSignedTLS) -> None:
    # A deadline within SLOT_WAIT: the call waits for the slot an idle peer is cut from.
    srv = webhook(serving, max_connections=2, deadline=0.5)
    peers = idle(srv, 2)
    try:
        start = time.monotonic()
        status, body = call(srv, serving)
        assert status == 200 and json.loads(body)["response"]["allowed"] is True
        assert 0.3 < time.monotonic() - start < 5
        # The idle peers were cut at their deadline, not left to the idle timeout.
        assert all(closed_by_peer(p, within=1.0) for p in peers)
    finally:
        for p in peers:
            p.close()
        srv.stop()


def test_a_trickling_peer_is_cut_at_the_deadline() -> None:
    srv = server.Server(
        "127.0.0.1", 0, checks={"process": lambda: (True, "ok")}, ready={}, deadline=1.0
    )
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as peer:
            peer.sendall(b"GET /healthz HTTP/1.1\r\n")
            start = time.monotonic()
            cut = False
            # A header line every 0.2 s: never idle long enough for the idle timeout.
            while not cut and time.monotonic() - start < 5:
                try:
                    peer.sendall(b"X-Slow: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
                    break
                cut = closed_by_peer(peer, within=0.2)
            assert cut and time.monotonic() - start < 3
    finally:
        srv.stop()


def test_a_connection_past_a_full_house_is_closed_not_left_waiting(
    serving: tls.SelfSignedTLS,
) -> None:
    srv = webhook(serving, max_connections=1)
    peers = idle(srv, 1)
    try:
        time.sleep(0.2)
        late = idle(srv, 1)[0]
        peers.append(late)
        assert closed_by_peer(late, within=server.SLOT_WAIT + 2)
    finally:
        for p in peers:
            p.close()
        srv.stop()


def test_a_500_says_nothing_of_the_exception_and_the_log_says_it_all(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(req: admission.Request, driver: str) -> admission.Decision:
        raise RuntimeError("token=s3cr3t-4f1e, from a bug of ours")

    monkeypatch.setattr(admission, "decide", broken)
    with caplog.at_level(logging.ERROR, logger="controller"):
        status, body, ctype = server.review(review(claim_obj(GOOD)), DRIVER)
    assert (status, ctype) == (500, "text/plain")
    assert body == b"internal error; see the controller's log\n"
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    line = logs.KeyValueFormatter().format(record)
    assert "token=s3cr3t-4f1e" in line
    assert "kind=ResourceClaim" in line and "uid=705ab4f5-6393-11e8-b7cc-42010a800002" in line


def test_a_malformed_reviews_answer_does_not_echo_a_huge_value() -> None:
    body = json.dumps({"apiVersion": "x" * 100_000, "kind": "AdmissionReview"}).encode()
    status, out, _ = server.review(body, DRIVER)
    assert status == 400 and b"(100000 characters)" in out and len(out) < 400
