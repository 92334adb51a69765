"""How the client awaits long-running things: one setting shared by the API layer and the objects above it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class PollPolicy:
    """How long-running things are awaited. With `long_poll` the backend holds each poll open until
    something changes (up to `long_poll_s`); the interval knobs pace plain polling."""

    interval_s: float = 0.5
    multiplier: float = 1.25
    max_interval_s: float = 6.0
    timeout_s: float = 1800.0
    long_poll: bool = True
    long_poll_s: float = 25.0
    # How long a wait that follows a job (TrainingJob.wait, result(), stream_logs, the widget) rides
    # through a backend that does not answer (a restart) before raising ConnectionError.
    reconnect_s: float = 180.0

    def intervals(self) -> Iterator[float]:
        interval = self.interval_s
        while True:
            yield interval
            interval = min(interval * self.multiplier, self.max_interval_s)
