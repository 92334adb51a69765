"""A per-token limit on how often a route may be called: at most `limit` calls in any `window_s` seconds.
Kept in memory: it guards the backend's own resources (the speed test's bandwidth), not an account."""

from __future__ import annotations

import time
from collections import deque

from cortex_nb.protocol.errors import ApiError


class PerTokenRate:
    def __init__(self, limit: int, window_s: float, what: str) -> None:
        self.limit = limit
        self.window_s = window_s
        self.what = what
        self._calls: dict[str, deque[float]] = {}

    def take(self, token_id: str) -> None:
        """Count one call, or refuse it with `rate_limited` (detail.retry_after_s) when over the limit."""
        now = time.monotonic()
        calls = self._calls.setdefault(token_id, deque())
        while calls and calls[0] <= now - self.window_s:
            calls.popleft()
        if len(calls) >= self.limit:
            retry_after = max(0.0, calls[0] + self.window_s - now)
            raise ApiError(
                "rate_limited",
                f"{self.what}: at most {self.limit} calls per {self.window_s:g} s per token; retry in"
                f" {retry_after:.0f} s",
                {"retry_after_s": round(retry_after, 3), "limit": self.limit},
            )
        calls.append(now)
        # Forget tokens that went quiet, so the table stays as small as the set of recent callers.
        if len(self._calls) > 1024:
            for key in [
                key for key, value in self._calls.items() if not value or value[-1] <= now - self.window_s
            ]:
                del self._calls[key]
