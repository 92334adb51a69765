"""Bounded log noise: the same message repeated many times a second (a client hammering a failing
path, an accept error) is kept to a few lines per interval plus a count of what was dropped, so a
misbehaving peer cannot fill the disk or drown the lines that matter."""

from __future__ import annotations

import logging
import time

INTERVAL_S = 10.0
PER_INTERVAL = 20


class RepeatLimit(logging.Filter):
    """At most `per_interval` records per (logger, message template) every `interval_s` seconds."""

    def __init__(self, interval_s: float = INTERVAL_S, per_interval: int = PER_INTERVAL) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.per_interval = per_interval
        self._windows: dict[tuple[str, str], list[float | int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.interval_s:
            dropped = int(window[2]) if window else 0
            self._windows[key] = [now, 1, 0]
            if len(self._windows) > 10_000:  # many distinct messages: forget the old windows
                self._windows = {key: self._windows[key]}
            if dropped:
                record.msg = f"{record.msg} [{dropped} more like this in the last {self.interval_s:.0f} s were dropped]"
            return True
        window[1] += 1
        if window[1] <= self.per_interval:
            return True
        window[2] += 1
        return False


def install(handler: logging.Handler) -> None:
    handler.addFilter(RepeatLimit())
