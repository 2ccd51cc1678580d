"""The API client's HTTP/1.1 reader and request writer, fed bytes through a socket pair
(the transport's own tests run it against a real HTTP server: test_transport.py)."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from dradriver.k8s.http1 import MAX_HEAD, Reply, request_head


def reply(data: bytes, head_only: bool = False, close: bool = True) -> Reply:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)

    def feed() -> None:
        theirs.sendall(data)
        if close:
            theirs.close()

    threading.Thread(target=feed, daemon=True).start()
    return Reply(ours, head_only)


def test_a_content_length_body_and_what_follows_it() -> None:
    r = reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhelloEXTRA")
    assert (r.status, r.reason, r.headers["x-a"]) == (200, "OK", "1, 2")
    assert r.read() == b"hello" and r.isclosed() and not r.will_close
    assert r.leftover == b"EXTRA"  # not a kept-alive connection's to reuse


def test_a_chunked_body_with_extensions_and_trailers() -> None:
    body = b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    r = reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, close=False)
    assert r.read() == b"hello world" and r.isclosed() and r.leftover == b""


def test_a_chunked_stream_is_read_as_it_comes() -> None:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    theirs.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\n\r\n")
    r = Reply(ours, head_only=False)
    assert r.read1(65536) == b"ab\n"  # without waiting for the rest of the stream
    theirs.sendall(b"2\r\ncd\r\n0\r\n\r\n")
    assert r.read1(65536) == b"cd" and r.read1(65536) == b"" and r.isclosed()


def test_bodies_that_are_not_there_and_one_read_to_the_close() -> None:
    assert reply(b"HTTP/1.1 204 No Content\r\n\r\n").read() == b""
    head = reply(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", head_only=True)
    assert head.read() == b"" and head.isclosed()
    r = reply(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nall of it")
    assert r.status == 200 and r.will_close and r.read() == b"all of it"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"", http.client.RemoteDisconnected),  # a stale kept-alive connection
        (b"HTTP/1.1 200 OK\r\nContent-", http.client.IncompleteRead),
        (b"SSH-2.0-OpenSSH\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * (MAX_HEAD + 10), http.client.LineTooLong),
    ],
)
def test_broken_heads(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        reply(data)


def test_a_body_cut_short_is_an_error() -> None:
    r = reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
    with pytest.raises(http.client.IncompleteRead):
        r.read()


def test_request_heads() -> None:
    head = request_head("POST", "/api/v1/x?a=b", "h:6443", {"Accept": "application/json"}, b"{}")
    assert head == (
        b"POST /api/v1/x?a=b HTTP/1.1\r\nHost: h:6443\r\nAccept: application/json\r\n"
        b"Content-Length: 2\r\n\r\n"
    )
    assert b"Content-Length" not in request_head("GET", "/", "h:1", {}, None)
    with pytest.raises(ValueError, match="line break"):
        request_head("GET", "/", "h:1", {"Authorization": "Bearer x\r\nEvil: 1"}, None)
