"""The protocol buffers wire format, as far as the Tinker messages need it: read a message into its fields,
write fields back. Kept to the encoding rules (varints, 64/32-bit fixed, length-delimited) so the backend
needs neither `protobuf` nor generated code; `messages.py` names the fields.
"""

from __future__ import annotations

import contextlib
import struct
import threading
from collections import defaultdict
from collections.abc import Iterator

from cortex_nb.protocol.errors import ApiError

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
NO_BUDGET = 1 << 62

# Fields (and packed values) left to read in the message being decoded by this thread (`field_budget`).
_budget = threading.local()


@contextlib.contextmanager
def field_budget(fields: int) -> Iterator[None]:
    """Read at most `fields` fields and packed values in all the `parse` calls of this block: a small body
    of tiny fields would otherwise take seconds of Python to read."""
    _budget.left = fields
    try:
        yield
    finally:
        del _budget.left


def _spent() -> ApiError:
    return _malformed("it holds more fields than a message of this API can (split the batch)")


def _malformed(what: str) -> ApiError:
    return ApiError("invalid_request", f"the protobuf body is malformed: {what}")


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise _malformed("a varint runs past the end")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise _malformed("a varint is longer than 10 bytes")


def parse(data: bytes | memoryview) -> dict[int, list[int | bytes]]:
    """A message's fields by number; each value is an int (varint/fixed) or the bytes of a length-delimited field."""
    view = memoryview(data)
    fields: dict[int, list[int | bytes]] = defaultdict(list)
    position, left = 0, getattr(_budget, "left", NO_BUDGET)
    while position < len(view):
        left -= 1
        if left < 0:
            raise _spent()
        key, position = _read_varint(view, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _malformed("field number 0")
        if wire_type == VARINT:
            value, position = _read_varint(view, position)
        elif wire_type == FIXED64:
            if position + 8 > len(view):
                raise _malformed("a 64-bit field runs past the end")
            value = int.from_bytes(view[position : position + 8], "little")
            position += 8
        elif wire_type == FIXED32:
            if position + 4 > len(view):
                raise _malformed("a 32-bit field runs past the end")
            value = int.from_bytes(view[position : position + 4], "little")
            position += 4
        elif wire_type == LENGTH:
            size, position = _read_varint(view, position)
            if position + size > len(view):
                raise _malformed("a length-delimited field runs past the end")
            value = bytes(view[position : position + size])
            position += size
        else:
            raise _malformed(f"wire type {wire_type} (groups are not used)")
        fields[number].append(value)
    if left < NO_BUDGET // 2:
        _budget.left = left
    return fields


def as_double(value: int) -> float:
    return struct.unpack("<d", value.to_bytes(8, "little"))[0]


def as_signed(value: int) -> int:
    """Two's complement for int32/int64 fields (negative numbers travel as 10-byte varints)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_varints(value: bytes) -> list[int]:
    view, position, values = memoryview(value), 0, []
    left = getattr(_budget, "left", NO_BUDGET)
    while position < len(view):
        left -= 1
        if left < 0:
            raise _spent()
        number, position = _read_varint(view, position)
        values.append(number)
    if left < NO_BUDGET // 2:
        _budget.left = left
    return values


class Writer:
    """Builds one message. Methods append a field; `bytes()` returns the encoding."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    @staticmethod
    def _varint(value: int) -> bytes:
        if value < 0:
            value += 1 << 64
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            if value:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def _key(self, number: int, wire_type: int) -> None:
        self._parts.append(self._varint(number << 3 | wire_type))

    def varint(self, number: int, value: int) -> Writer:
        self._key(number, VARINT)
        self._parts.append(self._varint(int(value)))
        return self

    def double(self, number: int, value: float) -> Writer:
        self._key(number, FIXED64)
        self._parts.append(struct.pack("<d", float(value)))
        return self

    def bytes_field(self, number: int, value: bytes) -> Writer:
        self._key(number, LENGTH)
        self._parts.append(self._varint(len(value)))
        self._parts.append(value)
        return self

    def string(self, number: int, value: str) -> Writer:
        return self.bytes_field(number, value.encode())

    def message(self, number: int, message: Writer) -> Writer:
        return self.bytes_field(number, message.bytes())

    def packed(self, number: int, values: list[int]) -> Writer:
        return self.bytes_field(number, b"".join(self._varint(int(v)) for v in values))

    def bytes(self) -> bytes:
        return b"".join(self._parts)
