"""HTTP/2's frames as far as a gRPC server needs them (pure: bytes in, records and bytes
out). From RFC 9113 (HTTP/2) and RFC 7541 (HPACK). Header blocks are decoded with the
hpack library, which keeps the connection's dynamic table; what this server sends is
encoded here without the dynamic table (RFC 7541 6.2.2, literals never indexed), so the
encoder has no state the peer could disagree with.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">HBBBL")  # length (24 bits, as 16 + 8), type, flags, stream id
HEADER_SIZE = HEADER.size
DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_LIMIT = (1 << 24) - 1


class FrameType(IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag:
    """Plain ints: an IntFlag's `&` cost more than parsing the frame it tested."""

    END_STREAM = 0x1  # ACK, on SETTINGS and PING
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


ACK = Flag.END_STREAM


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    ENHANCE_YOUR_CALM = 0xB


class ConnectionFault(Exception):
    """The peer broke the protocol: the connection ends with a GOAWAY of `code`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamFault(Exception):
    """The peer broke the protocol on one stream: it is reset with `code`."""

    def __init__(self, stream_id: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.stream_id, self.code = stream_id, code


@dataclass(frozen=True, slots=True)
class FrameHead:
    length: int
    type: int
    flags: int
    stream_id: int


def parse_head(buf: bytes | bytearray | memoryview, at: int = 0) -> FrameHead:
    hi, lo, type_, flags, sid = HEADER.unpack_from(buf, at)
    return FrameHead((hi << 8) | lo, type_, flags, sid & MAX_WINDOW)


def frame(type_: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEADER.pack(n >> 8, n & 0xFF, type_, flags, stream_id) + payload


def unpad(head: FrameHead, payload: bytes) -> bytes:
    """The payload of a DATA or HEADERS frame without its padding (RFC 9113 6.1)."""
    if not head.flags & Flag.PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionFault(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def header_fragment(head: FrameHead, payload: bytes) -> bytes:
    """The header block fragment of a HEADERS frame: padding and priority taken off."""
    body = unpad(head, payload)
    if head.flags & Flag.PRIORITY:
        if len(body) < 5:
            raise ConnectionFault(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority truncated")
        body = body[5:]
    return body


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionFault(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
    return [struct.unpack_from(">HL", payload, i) for i in range(0, len(payload), 6)]


def settings(values: dict[Setting, int]) -> bytes:
    return frame(
        FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in values.items())
    )


SETTINGS_ACK = frame(FrameType.SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def parse_window_update(head: FrameHead, payload: bytes) -> int:
    if len(payload) != 4:
        raise ConnectionFault(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE length not 4")
    return int(struct.unpack(">L", payload)[0]) & MAX_WINDOW


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + debug)


def ping_ack(payload: bytes) -> bytes:
    return frame(FrameType.PING, ACK, 0, payload)


def data_frame(stream_id: int, data: bytes) -> bytes:
    return frame(FrameType.DATA, 0, stream_id, data)  # trailers end the stream


def headers_frames(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """HEADERS, then CONTINUATION frames where the block exceeds the peer's frame size."""
    first, rest = block[:max_frame], block[max_frame:]
    flags = (Flag.END_STREAM if end_stream else 0) | (0 if rest else Flag.END_HEADERS)
    out = [frame(FrameType.HEADERS, flags, stream_id, first)]
    while rest:
        chunk, rest = rest[:max_frame], rest[max_frame:]
        out.append(frame(FrameType.CONTINUATION, 0 if rest else Flag.END_HEADERS, stream_id, chunk))
    return b"".join(out)


# RFC 7541 appendix A: the static table entries this server's answers use.
_STATIC_FIELDS = {(b":status", b"200"): 8}
_STATIC_NAMES = {b"content-type": 31}


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries `first`'s high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(s: bytes) -> bytes:
    return _int(len(s), 7, 0) + s  # never Huffman-coded (H = 0)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block: a dynamic table size update to 0 (this encoder never uses the
    table, whatever SETTINGS_HEADER_TABLE_SIZE the peer announces), then each field
    indexed from the static table or as a literal never indexed. Stateless, so the
    blocks of every answer's constant headers are encoded once."""
    return _encode(tuple(headers))


@lru_cache(maxsize=64)
def _encode(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    out = [b"\x20"]
    for name, value in headers:
        index = _STATIC_FIELDS.get((name, value))
        if index is not None:
            out.append(_int(index, 7, 0x80))
            continue
        name_index = _STATIC_NAMES.get(name)
        if name_index is not None:
            out.append(_int(name_index, 4, 0x10) + _string(value))
        else:
            out.append(b"\x10" + _string(name) + _string(value))
    return b"".join(out)
