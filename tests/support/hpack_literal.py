"""Just enough HPACK (RFC 7541) for a test client that needs no HPACK library.

Encoding: every field is a "literal header field without indexing, new name" (6.2.2:
a 0x00 byte, then the name and the value as string literals with a 7-bit length prefix
and no Huffman coding). Any decoder must accept it, and it leaves the server's dynamic
table empty, so nothing the client sends depends on what the server remembered.

Decoding: the client announces SETTINGS_HEADER_TABLE_SIZE=0, so the server's header
blocks refer to the static table at most; of it only the names a gRPC answer uses are
known here. A Huffman-coded string is not decoded (it comes back as "<huffman>"): the
fields these tests read (grpc-status, :status) are digits that encoders send plain or
from the static table.
"""

from __future__ import annotations

# The static table entries (RFC 7541 Appendix A) a gRPC server's answer may refer to.
_STATIC: dict[int, tuple[str, str]] = {
    1: (":authority", ""),
    2: (":method", "GET"),
    3: (":method", "POST"),
    4: (":path", "/"),
    5: (":path", "/index.html"),
    6: (":scheme", "http"),
    7: (":scheme", "https"),
    8: (":status", "200"),
    9: (":status", "204"),
    10: (":status", "206"),
    11: (":status", "304"),
    12: (":status", "400"),
    13: (":status", "404"),
    14: (":status", "500"),
    16: ("accept-encoding", "gzip, deflate"),
    26: ("content-encoding", ""),
    28: ("content-length", ""),
    31: ("content-type", ""),
    58: ("user-agent", ""),
}
_STATIC_SIZE = 61


class HpackError(ValueError):
    pass


def _int(n: int, prefix_bits: int, first: int = 0) -> bytes:
    """An integer with an N-bit prefix (5.1); `first` holds the byte's other bits."""
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes([first | n])
    out = bytearray([first | limit])
    n -= limit
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode(fields: list[tuple[str, str]]) -> bytes:
    out = bytearray()
    for name, value in fields:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _int(len(n), 7) + n + _int(len(v), 7) + v
    return bytes(out)


def _read_int(block: bytes, i: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    n = block[i] & limit
    i += 1
    if n < limit:
        return n, i
    shift = 0
    while True:
        if i >= len(block) or shift > 28:
            raise HpackError("integer runs past the block")
        b = block[i]
        i += 1
        n += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _read_string(block: bytes, i: int) -> tuple[str, int]:
    if i >= len(block):
        raise HpackError("string runs past the block")
    huffman = bool(block[i] & 0x80)
    length, i = _read_int(block, i, 7)
    if i + length > len(block):
        raise HpackError("string runs past the block")
    raw = block[i : i + length]
    return ("<huffman>" if huffman else raw.decode(errors="replace")), i + length


def _name(index: int) -> str:
    if index > _STATIC_SIZE:
        raise HpackError(f"index {index} is in the dynamic table, which is 0 bytes here")
    return _STATIC.get(index, (f"<static {index}>", ""))[0]


def decode(block: bytes) -> list[tuple[str, str]]:
    """The fields of a header block from a peer told that our table holds 0 bytes."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(block):
        b = block[i]
        if b & 0x80:  # indexed field (6.1)
            index, i = _read_int(block, i, 7)
            if index == 0 or index > _STATIC_SIZE:
                raise HpackError(f"indexed field {index} outside the static table")
            out.append(_STATIC.get(index, (f"<static {index}>", "")))
            continue
        if b & 0xE0 == 0x20:  # dynamic table size update (6.3): to 0, as we asked
            size, i = _read_int(block, i, 5)
            if size:
                raise HpackError(f"table size update to {size} over our 0")
            continue
        # Literal with incremental indexing (6 bits) or without / never indexed (4 bits):
        # with a 0-byte table, all three read the same.
        index, i = _read_int(block, i, 6 if b & 0x40 else 4)
        if index:
            name = _name(index)
        else:
            name, i = _read_string(block, i)
        value, i = _read_string(block, i)
        out.append((name, value))
    return out
