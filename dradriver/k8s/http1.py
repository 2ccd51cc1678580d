"""HTTP/1.1 requests and responses on a connected socket (RFC 9112): what the API
server's answers use, and no more.

Why not http.client's request and response: building the request through putheader and
parsing the response's headers with the email package took 0.1-0.3 ms of each claim GET
on the plugin's hot path, a tenth of a prepare. http.client still connects (TCP, the
proxy's CONNECT tunnel); these only read and write bytes on its socket. Errors are
http.client's, so that callers tell a stale connection (RemoteDisconnected) from others.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Mapping

MAX_HEAD = 64 << 10  # a status line and headers larger than this are refused
_NO_BODY = frozenset({204, 304})


def request_head(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """The request line and headers (Host and Content-Length added)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r}: a line break or colon would split the request")
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Reply:
    """One response: status and headers read at construction, the body left on the socket
    (`read`, or `read1` piece by piece); `leftover` is what arrived past its end."""

    def __init__(self, sock: socket.socket, head_only: bool, buffered: bytes = b"") -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self.status, self.reason, self.headers = self._read_head()
        while 100 <= self.status < 200:  # 100 Continue and the like: the answer follows
            self.status, self.reason, self.headers = self._read_head()
        h = self.headers
        self.will_close = "close" in h.get("connection", "").lower()
        self._chunked = False
        self._left: int | None = 0  # body bytes left; None: until the connection closes
        self._done = False
        if head_only or self.status in _NO_BODY:
            self._done = True
        elif "chunked" in h.get("transfer-encoding", "").lower():
            self._chunked = True
            self._left = 0  # of the current chunk
        elif "content-length" in h:
            try:
                self._left = int(h["content-length"])
            except ValueError:
                raise http.client.BadStatusLine(f"Content-Length {h['content-length']!r}") from None
            self._done = self._left == 0
        else:
            self._left = None
            self.will_close = True

    # -- the head --------------------------------------------------------------------------
    def _fill(self) -> bool:
        data = self._sock.recv(65536)
        if not data:
            return False
        self._buf += data
        return True

    def _read_head(self) -> tuple[int, str, dict[str, str]]:
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            if len(self._buf) > MAX_HEAD:
                raise http.client.LineTooLong("response headers")
            had = len(self._buf)
            if not self._fill():
                if not had:
                    raise http.client.RemoteDisconnected("closed without an answer")
                raise http.client.IncompleteRead(bytes(self._buf))
        head = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[: end + 4]
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise http.client.BadStatusLine(status_line)
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                continue
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if parts[0] == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
            headers["connection"] = "close"
        return int(parts[1]), parts[2] if len(parts) > 2 else "", headers

    # -- the body --------------------------------------------------------------------------
    def isclosed(self) -> bool:
        """The whole body was read."""
        return self._done

    @property
    def leftover(self) -> bytes:
        return bytes(self._buf)

    def read(self) -> bytes:
        out = bytearray()
        while not self._done:
            out += self.read1(1 << 20)
        return bytes(out)

    def read1(self, n: int) -> bytes:
        """Up to `n` body bytes, as soon as any arrive; b"" at the end."""
        if self._done:
            return b""
        if self._chunked and self._left == 0:
            self._next_chunk()
            if self._done:
                return b""
        if not self._buf and not self._fill():
            if self._left is None:
                self._done = True
                return b""
            raise http.client.IncompleteRead(b"")
        take = len(self._buf) if self._left is None else min(self._left, len(self._buf))
        take = min(take, n)
        out = bytes(self._buf[:take])
        del self._buf[:take]
        if self._left is not None:
            self._left -= take
            if self._left == 0 and not self._chunked:
                self._done = True
            elif self._left == 0:
                self._line()  # the CRLF after a chunk's data
        return out

    def _line(self) -> bytes:
        while (end := self._buf.find(b"\r\n")) < 0:
            if len(self._buf) > MAX_HEAD:
                raise http.client.LineTooLong("chunk size")
            if not self._fill():
                raise http.client.IncompleteRead(bytes(self._buf))
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _next_chunk(self) -> None:
        line = self._line().split(b";", 1)[0].strip()
        try:
            size = int(line, 16)
        except ValueError:
            raise http.client.BadStatusLine(f"chunk size {line!r}") from None
        if size:
            self._left = size
            return
        while self._line():  # trailers, up to the empty line
            pass
        self._done = True
