"""gRPC's wire format over HTTP/2, as far as the kubelet's calls need it (pure: bytes and
headers in, bytes and headers out). From the gRPC over HTTP/2 protocol description
(github.com/grpc/grpc, doc/PROTOCOL-HTTP2.md):

- a message is a 1-byte compressed flag, a 4-byte big-endian length and the bytes;
- a response is HEADERS (:status 200, content-type application/grpc), DATA with the
  messages, then trailers (grpc-status, grpc-message) ending the stream; an error with
  no message is "trailers-only": one HEADERS frame with all of it;
- grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from enum import IntEnum

PREFIX = struct.Struct(">BI")
CONTENT_TYPE = b"application/grpc"


class Status(IntEnum):
    """The gRPC status codes this server answers with."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class FramingError(ValueError):
    """A request body that is not gRPC messages this server can read."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def frame(payload: bytes) -> bytes:
    return PREFIX.pack(0, len(payload)) + payload


def messages(body: bytes, limit: int) -> Iterator[bytes]:
    """The messages in a complete request body."""
    at = 0
    while at < len(body):
        if len(body) - at < PREFIX.size:
            raise FramingError(Status.INTERNAL, "truncated gRPC message prefix")
        compressed, size = PREFIX.unpack_from(body, at)
        at += PREFIX.size
        if compressed:
            raise FramingError(
                Status.UNIMPLEMENTED, "compressed messages are not accepted (identity only)"
            )
        if size > limit:
            raise FramingError(
                Status.RESOURCE_EXHAUSTED, f"message of {size} bytes exceeds the limit of {limit}"
            )
        if len(body) - at < size:
            raise FramingError(Status.INTERNAL, "truncated gRPC message")
        yield body[at : at + size]
        at += size


def one_message(body: bytes, limit: int) -> bytes:
    """The single request message of a unary or server-streaming call."""
    found = list(messages(body, limit))
    if len(found) != 1:
        raise FramingError(
            Status.INTERNAL, f"expected exactly one request message, got {len(found)}"
        )
    return found[0]


def response_headers() -> list[tuple[bytes, bytes]]:
    return [(b":status", b"200"), (b"content-type", CONTENT_TYPE)]


def trailers(status: Status, message: str = "") -> list[tuple[bytes, bytes]]:
    out = [(b"grpc-status", str(int(status)).encode())]
    if message:
        out.append((b"grpc-message", percent_encode(message)))
    return out


def trailers_only(status: Status, message: str) -> list[tuple[bytes, bytes]]:
    return response_headers() + trailers(status, message)


def percent_encode(message: str) -> bytes:
    out = bytearray()
    for b in message.encode("utf-8"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def percent_decode(value: bytes) -> str:
    out = bytearray()
    i = 0
    while i < len(value):
        if value[i] == 0x25 and i + 2 < len(value):
            try:
                out.append(int(value[i + 1 : i + 3], 16))
                i += 3
                continue
            except ValueError:
                pass
        out.append(value[i])
        i += 1
    return out.decode("utf-8", errors="replace")


def request_problem(headers: dict[bytes, bytes]) -> str:
    """Why a request's headers are not a gRPC call, or ""."""
    if headers.get(b":method") != b"POST":
        return f"method {headers.get(b':method', b'').decode(errors='replace')!r} is not POST"
    ctype = headers.get(b"content-type", b"")
    if not (ctype == CONTENT_TYPE or ctype.startswith(CONTENT_TYPE + b"+")):
        return f"content-type {ctype.decode(errors='replace')!r} is not application/grpc"
    encoding = headers.get(b"grpc-encoding", b"identity")
    if encoding != b"identity":
        return f"grpc-encoding {encoding.decode(errors='replace')!r} is not supported"
    return ""
