"""forward_backward bodies (protobuf, maybe zstd) decoded off the IO loop, with bounded sizes.

A small zstd body can expand into megabytes of tiny protobuf fields that take seconds of pure Python to
read. So decompression streams into at most `limit` bytes (whatever size the frame declares, or none),
and decoding runs in a small pool of its own, one body per owner at a time: a flood of such bodies from
one owner queues behind itself, while the IO loop and other owners' bodies keep their turns.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import zstandard

from cortex_nb.protocol.errors import ApiError

from ...keyed_turns import KeyedTurns
from .messages import ForwardBackwardRequest, decode_forward_backward

DECODE_THREADS = 2
READ_BYTES = 1024 * 1024


def decompress(body: bytes, limit: int) -> bytes:
    """A zstd body, decompressed piece by piece to no more than `limit` bytes."""
    pieces, size = [], 0
    try:
        declared = zstandard.frame_content_size(body)
        if declared > limit:
            raise _too_large(limit)
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        while piece := reader.read(READ_BYTES):
            size += len(piece)
            if size > limit:
                raise _too_large(limit)
            pieces.append(piece)
    except zstandard.ZstdError as exc:
        raise ApiError("invalid_request", f"the zstd body could not be decompressed: {exc}") from None
    return b"".join(pieces)


def _too_large(limit: int) -> ApiError:
    return ApiError("body_too_large", f"the zstd body holds more than {limit} bytes", {"limit": limit})


def _decode(body: bytes, compressed: bool, limit: int) -> ForwardBackwardRequest:
    return decode_forward_backward(decompress(body, limit) if compressed else body)


class Decoder:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="tinker-decode")
        # One body per owner at a time.
        self._turns = KeyedTurns()

    async def forward_backward(self, owner: str, body: bytes, compressed: bool) -> ForwardBackwardRequest:
        async with self._turns.turn(owner):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, _decode, body, compressed, self.limit)
