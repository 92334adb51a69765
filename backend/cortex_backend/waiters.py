"""Long-poll support: a handler waits on a key until something about it changes (or time runs out)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict


class Waiters:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future]] = defaultdict(set)

    async def wait(self, key: str, timeout: float) -> bool:
        """True if `notify(key)` happened before `timeout` seconds."""
        return await self.wait_any((key,), timeout)

    async def wait_any(self, keys: tuple[str, ...], timeout: float) -> bool:
        """True if `notify` of any of `keys` happened before `timeout` seconds."""
        if timeout <= 0:
            return False
        future = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiting[key].add(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            for key in keys:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiting[key]
            if not future.done():
                future.cancel()

    def notify(self, key: str) -> None:
        for future in self._waiting.pop(key, set()):
            with contextlib.suppress(asyncio.InvalidStateError):
                future.set_result(True)
