"""HPACK header block decoding (RFC 7541), one connection's dynamic table.

Why not hpack's Decoder: its per-field objects, logging and size bookkeeping took about
50 us a request, as much as the rest of reading one. The static table and the Huffman
code (RFC 7541 appendices A and B) are the hpack library's, which also decodes Huffman
strings: facts and a well-tested state machine this module need not repeat.
"""

from __future__ import annotations

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
_STATIC_COUNT = len(_STATIC)
_ENTRY_OVERHEAD = 32  # RFC 7541 4.1


class HpackError(ValueError):
    """A header block that does not decode: a COMPRESSION_ERROR for the connection."""


class Decoder:
    """Not thread-safe: one connection's reader decodes its blocks in order."""

    def __init__(self, max_table_size: int = 4096, max_list_size: int = 64 << 10) -> None:
        self.max_allowed = max_table_size  # what SETTINGS_HEADER_TABLE_SIZE announced
        self.max_size = max_table_size
        self.max_list_size = max_list_size
        self._table: list[tuple[bytes, bytes]] = []  # newest first
        self._size = 0

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_COUNT:
            return _STATIC[index - 1]
        try:
            if index > _STATIC_COUNT:
                return self._table[index - _STATIC_COUNT - 1]
        except IndexError:
            pass
        raise HpackError(f"header index {index} not in the table")

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
        self._table.insert(0, field)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self.max_size:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD

    def decode(self, data: bytes) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        listed = 0
        at, end = 0, len(data)
        try:
            while at < end:
                b = data[at]
                if b & 0x80:  # indexed field
                    index, at = _integer(data, at, 7)
                    field = self._entry(index)
                elif b & 0x40:  # literal, added to the table
                    field, at = self._literal(data, at, 6)
                    self._add(field)
                elif b & 0x20:  # dynamic table size update
                    if out:
                        raise HpackError("a table size update after a header field")
                    size, at = _integer(data, at, 5)
                    if size > self.max_allowed:
                        raise HpackError(f"table size {size} over the {self.max_allowed} allowed")
                    self.max_size = size
                    self._evict()
                    continue
                else:  # literal, not added (never indexed, or without indexing)
                    field, at = self._literal(data, at, 4)
                listed += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
                if listed > self.max_list_size:
                    raise HpackError(f"header list over {self.max_list_size} bytes")
                out.append(field)
        except IndexError:
            raise HpackError("header block truncated") from None
        return out

    def _literal(self, data: bytes, at: int, bits: int) -> tuple[tuple[bytes, bytes], int]:
        index, at = _integer(data, at, bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, at = _string(data, at)
        value, at = _string(data, at)
        return (name, value), at


def _integer(data: bytes, at: int, bits: int) -> tuple[int, int]:
    """An integer with a `bits`-bit prefix at `at` (RFC 7541 5.1); the offset after it."""
    limit = (1 << bits) - 1
    value = data[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while True:
        b = data[at]
        at += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at
        if shift > 28:
            raise HpackError("integer too long")


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    huffman = data[at] & 0x80
    length, at = _integer(data, at, 7)
    raw = data[at : at + length]
    if len(raw) != length:
        raise HpackError("string truncated")
    at += length
    if not huffman:
        return bytes(raw), at
    try:
        return decode_huffman(raw), at
    except Exception as exc:  # hpack's HPACKDecodingError: bad padding or an EOS
        raise HpackError(f"Huffman: {exc}") from exc
