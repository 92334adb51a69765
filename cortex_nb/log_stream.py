"""Following a job's logs from the client: an iterator over lines that survives dropped connections.

It reads the backend's follow stream (`GET .../logs?follow=1`, newline-delimited JSON) and remembers
the last sequence number it yielded. When the connection drops, it reconnects from that cursor with
the transport's backoff, so every line arrives once, in order. Without `follow` it pages through
what is there now and stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from . import errors
from .api import Api, HasApi, api_of
from .reconnect import Reconnect

PAGE_LIMIT = 5000
HEARTBEAT_S = 10.0


class LogStream:
    """Iterate to get log lines ({seq, sub_job_id, at, stream, line}). After (or during) iteration:
    `cursor` is the last seq received, `dropped` how many lines retention removed before they could
    be read, `job_status` the job's status as last reported, `reconnects` how often it resumed."""

    def __init__(
        self,
        client: Api | HasApi,
        job_id: str,
        *,
        follow: bool = True,
        cursor: int = 0,
        sub_job: str | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.client = client
        self.api = api_of(client)
        self.job_id = job_id
        self.follow = follow
        self.cursor = cursor
        self.sub_job = sub_job
        self.heartbeat_s = heartbeat_s
        self.dropped = 0
        self.job_status: str | None = None
        self.reconnects = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._follow() if self.follow else self._pages()

    def __repr__(self) -> str:
        return (
            f"<LogStream {self.job_id} cursor={self.cursor} dropped={self.dropped} status={self.job_status}>"
        )

    def _pages(self) -> Iterator[dict[str, Any]]:
        while True:
            page = self.api.job_logs(self.job_id, self.cursor, PAGE_LIMIT, self.sub_job)
            self.dropped += page.get("dropped", 0)
            self.job_status = page.get("job_status")
            for line in page["lines"]:
                if line["seq"] > self.cursor:
                    self.cursor = line["seq"]
                    yield line
            self.cursor = max(self.cursor, page["cursor"])
            if not page["lines"]:
                return

    def _follow(self) -> Iterator[dict[str, Any]]:
        # A dropped stream is resumed from the cursor, through a backend restart too (reconnect.py).
        reconnect = Reconnect(self.api.poll.reconnect_s)
        failures = 0
        while True:
            try:
                with self.api.follow_job_logs(
                    self.job_id, self.cursor, sub_job=self.sub_job, heartbeat_s=self.heartbeat_s
                ) as lines:
                    for raw in lines:
                        if not raw:
                            continue
                        record = json.loads(raw)
                        failures = 0
                        reconnect.back()
                        kind = record.pop("type", "line")
                        if kind == "line":
                            if record["seq"] > self.cursor:  # never twice, even across a resume
                                self.cursor = record["seq"]
                                yield record
                        elif kind == "dropped":
                            self.dropped += record["dropped"]
                            self.cursor = max(self.cursor, record["cursor"])
                        elif kind == "heartbeat":
                            self.job_status = record.get("job_status")
                        elif kind == "end":
                            self.job_status = record.get("job_status")
                            return
            except (
                errors.ConnectionError,
                errors.BackendError,
                errors.RateLimitError,
                json.JSONDecodeError,
            ) as exc:
                # A dropped connection, a backend restarting, or a line cut in half: resume from the cursor.
                last_error: Exception = exc
            else:
                last_error = errors.ConnectionError(
                    "the log stream closed before the job ended", code="backend_unavailable"
                )
            failures += 1
            self.reconnects += 1
            try:
                reconnect.wait(last_error)
            except Exception:
                raise errors.ConnectionError(
                    f"lost the log stream of job {self.job_id} for {reconnect.away_s:.0f}s ({failures} tries)"
                    f" at cursor {self.cursor}; resume with stream_logs(..., cursor={self.cursor})."
                    f" Last error: {last_error}",
                    code="backend_unavailable",
                ) from last_error
