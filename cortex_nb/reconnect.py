"""Riding through a backend restart: the waits that follow a job (`TrainingJob.wait`, a request's
`result()`, `stream_logs`, the job widget) keep trying with bounded backoff while the backend does not
answer, for `PollPolicy.reconnect_s` (default three minutes; `Client(reconnect_s=...)` or a profile's
`reconnect_s`), instead of giving up after the transport's few quick retries. A draining backend's
`backend_draining` answers count as away too: it is about to restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from . import errors

T = TypeVar("T")

# Codes that mean the backend is away or stopping, not that it refused the call.
AWAY_CODES = frozenset({"backend_unavailable", "backend_draining"})


def backend_away(exc: BaseException) -> bool:
    """Is this error the backend being away (stopped, restarting, draining) rather than a refusal?"""
    return isinstance(exc, errors.ConnectionError) or (
        isinstance(exc, errors.CortexError) and exc.code in AWAY_CODES
    )


class Reconnect:
    """Backoff while the backend is away, bounded by `budget_s` of continuous absence."""

    def __init__(self, budget_s: float, initial_s: float = 0.5, cap_s: float = 5.0) -> None:
        self.budget_s = budget_s
        self.initial_s = initial_s
        self.cap_s = cap_s
        self.away_since: float | None = None
        self._delay = initial_s

    @property
    def away_s(self) -> float:
        return 0.0 if self.away_since is None else time.monotonic() - self.away_since

    def back(self) -> None:
        """The backend answered: the next absence gets the whole budget again."""
        self.away_since = None
        self._delay = self.initial_s

    def wait(self, exc: BaseException, sleep: Callable[[float], object] = time.sleep) -> None:
        """Sleep before the next try, or raise `exc` once the backend has been away longer than the budget."""
        now = time.monotonic()
        if self.away_since is None:
            self.away_since = now
        if now - self.away_since >= self.budget_s:
            raise exc
        sleep(min(self._delay, max(self.budget_s - (now - self.away_since), 0.0)))
        self._delay = min(self._delay * 2, self.cap_s)


def riding_through(
    call: Callable[[], T], budget_s: float, on_away: Callable[[BaseException, float], None] | None = None
) -> T:
    """`call()`, tried again while the backend is away (for up to `budget_s`); other errors raise at once.
    `on_away(error, seconds away)` hears of each failed try."""
    reconnect = Reconnect(budget_s)
    while True:
        try:
            return call()
        except errors.CortexError as exc:
            if not backend_away(exc):
                raise
            if on_away is not None:
                on_away(exc, reconnect.away_s)
            reconnect.wait(exc)
