"""PUT one chunk of a large frame; the data-plane POST then names the upload."""

from __future__ import annotations

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .base import BaseHandler


class UploadChunkHandler(BaseHandler):
    def body_limit(self) -> int:
        return wire.CHUNK_BYTES

    def put(self, upload_id: str, index: str) -> None:
        if not index.isdigit():
            raise ApiError("invalid_field", "index: must be a non-negative integer", {"field": "index"})
        count = self.request.headers.get(wire.CHUNK_COUNT_HEADER, "")
        sha = self.request.headers.get(wire.CHUNK_SHA_HEADER, "")
        if not count.isdigit() or not sha:
            raise ApiError("invalid_request", f"send {wire.CHUNK_COUNT_HEADER} and {wire.CHUNK_SHA_HEADER} headers with each chunk")
        self.write_json(self.service.uploads.put_chunk(self.principal, upload_id, int(index), int(count), sha, self.body))
