"""The link speed test: send N bytes, or count a body's bytes as they arrive (nothing is kept)."""

from __future__ import annotations

import hashlib
import time

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.speedtest import MAX_SPEEDTEST_BYTES

from .base import BaseHandler

BLOCK = 1 << 20
# One block of incompressible bytes, sent as often as needed (made once: fresh random bytes per call cost more).
_BLOCK_BYTES = hashlib.shake_128(b"cortex-nb speed test").digest(BLOCK)


class SpeedtestHandler(BaseHandler):
    def body_limit(self) -> int:
        return MAX_SPEEDTEST_BYTES

    def prepare(self) -> None:
        super().prepare()
        self.service.speedtest_rate.take(self.principal.token_id)
        self._first_byte_at: float | None = None
        self._last_byte_at: float | None = None

    def data_received(self, chunk: bytes) -> None:
        # Counted, never kept.
        now = time.monotonic()
        if self._first_byte_at is None:
            self._first_byte_at = now
        self._last_byte_at = now
        self._received += len(chunk)
        if self._received > self._body_limit:
            self._body_too_large = True

    async def get(self) -> None:
        size = self.query_args().bytes
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(size))
        self.set_header("Cache-Control", "no-store")
        sent = 0
        while sent < size:
            block = _BLOCK_BYTES[: min(BLOCK, size - sent)]
            self.write(block)
            await self.flush()
            sent += len(block)
        self.finish()

    def post(self) -> None:
        if self._body_too_large:
            raise ApiError(
                "body_too_large",
                f"the body is {self._received} bytes; a speed test takes at most {MAX_SPEEDTEST_BYTES}",
                {"limit": MAX_SPEEDTEST_BYTES},
            )
        elapsed = (self._last_byte_at or 0.0) - (self._first_byte_at or 0.0)
        self.write_json({"bytes": self._received, "receive_s": round(elapsed, 6)})
