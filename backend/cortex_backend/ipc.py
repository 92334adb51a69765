"""Messages between the service and its worker processes over a socket pair.

A message is a JSON header plus an optional binary blob (a safetensors frame), length-prefixed.
The worker side uses blocking sockets; the service side uses asyncio streams.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from typing import Any

_PREFIX = struct.Struct(">IQ")


def pack_header(header: dict[str, Any], blob_len: int) -> bytes:
    """A message up to its blob (which the sender may then write in slices)."""
    encoded = json.dumps(header).encode()
    return _PREFIX.pack(len(encoded), blob_len) + encoded


def pack(header: dict[str, Any], blob: bytes = b"") -> bytes:
    return pack_header(header, len(blob)) + blob


async def read_message(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """Read one message; raises `asyncio.IncompleteReadError` when the worker is gone."""
    prefix = await reader.readexactly(_PREFIX.size)
    header_len, blob_len = _PREFIX.unpack(prefix)
    header = json.loads(await reader.readexactly(header_len))
    blob = await reader.readexactly(blob_len) if blob_len else b""
    return header, blob


class ChannelClosed(BaseException):
    """The service closed the worker's channel (it stopped, or was killed). BaseException so the
    `except Exception` blocks around operations (which report a failure over the same channel) let it
    through: the worker then stops quietly instead of printing a BrokenPipeError traceback."""


class BlockingChannel:
    """The worker's end: thread-safe sends, blocking receives."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        data = pack(header, blob)
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:  # BrokenPipeError, ConnectionResetError: nobody reads any more
                raise ChannelClosed(str(exc)) from None

    def _read_exactly(self, size: int) -> bytes:
        chunks, remaining = [], size
        while remaining:
            chunk = self._sock.recv(min(remaining, 1 << 20))
            if not chunk:
                raise EOFError("the service closed the channel")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> tuple[dict[str, Any], bytes]:
        header_len, blob_len = _PREFIX.unpack(self._read_exactly(_PREFIX.size))
        header = json.loads(self._read_exactly(header_len))
        blob = self._read_exactly(blob_len) if blob_len else b""
        return header, blob
