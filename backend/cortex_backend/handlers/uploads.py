"""PUT one chunk of a large frame; the data-plane POST then names the upload."""

from __future__ import annotations

import asyncio

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from ..validation import parse_decimal
from .base import BaseHandler


class UploadChunkHandler(BaseHandler):
    def body_limit(self) -> int:
        return wire.CHUNK_BYTES

    async def put(self, upload_id: str, index: str) -> None:
        count = self.request.headers.get(wire.CHUNK_COUNT_HEADER)
        sha = self.request.headers.get(wire.CHUNK_SHA_HEADER, "")
        if count is None or not sha:
            raise ApiError(
                "invalid_request",
                f"send {wire.CHUNK_COUNT_HEADER} and {wire.CHUNK_SHA_HEADER} headers with each chunk",
            )
        chunk_index = parse_decimal(index, "index", wire.MAX_CHUNKS)
        chunk_count = parse_decimal(count, wire.CHUNK_COUNT_HEADER, wire.MAX_CHUNKS)
        # Hashing and writing an 8 MiB chunk happen in a thread, off the IO loop.
        self.write_json(
            await asyncio.to_thread(
                self.service.uploads.put_chunk,
                self.principal,
                upload_id,
                chunk_index,
                chunk_count,
                sha,
                self.body,
            )
        )
