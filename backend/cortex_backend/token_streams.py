"""Streamed generates in flight: the tokens their workers report, held until the streaming reply sends them.

Only a request whose reply is streaming is open here; tokens of any other request are dropped. Nothing
is written to the store: a stream is live news, and the request's result (recorded as for any generate)
is what lasts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .waiters import Waiters


class TokenStreams:
    def __init__(self) -> None:
        self._pieces: dict[str, list[list[dict[str, Any]]]] = {}
        self.waiters = Waiters()

    def open(self, request_id: str) -> None:
        self._pieces.setdefault(request_id, [])

    def close(self, request_id: str) -> None:
        self._pieces.pop(request_id, None)
        self.waiters.notify(request_id)

    def feed(self, request_id: str, samples: list[dict[str, Any]]) -> None:
        """A worker's report of newly decoded tokens."""
        pieces = self._pieces.get(request_id)
        if pieces is not None:
            pieces.append(samples)
            self.waiters.notify(request_id)

    def take(self, request_id: str) -> list[list[dict[str, Any]]]:
        """The pieces reported since the last take, oldest first."""
        pieces = self._pieces.get(request_id)
        if not pieces:
            return []
        taken = list(pieces)
        pieces.clear()
        return taken

    def is_open(self, request_id: str) -> bool:
        return request_id in self._pieces

    async def news(self, request_id: str, ended: Waiters, timeout: float) -> bool:
        """Wait for tokens of `request_id`, its stream closing, or its end (which `ended` is notified of);
        False after `timeout` seconds of quiet."""
        waits = [
            asyncio.ensure_future(self.waiters.wait(request_id, timeout)),
            asyncio.ensure_future(ended.wait(request_id, timeout)),
        ]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for future in pending:
            future.cancel()
        return any(future.result() for future in done)
