"""Logs: a page of lines after a cursor (jobs and runs), and the records of a followed stream."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..states import JOB_STATES
from .base import WAIT_BOUND_TEXT, Cursor, Query, Reply, WaitSeconds

JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]


class LogLine(Reply):
    seq: int
    at: float
    sub_job_id: str | None
    stream: str = Field(description="stdout or stderr")
    line: str


class LogPage(Reply):
    lines: list[LogLine]
    cursor: int = Field(description="the last line's seq: ask for lines after it next time")
    dropped: int = Field(
        description="lines retention dropped between the cursor asked for and the first line here"
    )
    retention_lines: int


class JobLogPage(LogPage):
    job_status: JobStatus


class RunLogPage(LogPage):
    run_status: JobStatus


class JobLogsQuery(Query):
    cursor: Cursor = 0
    limit: int = Field(default=1000, ge=1, description="at most 5000")
    sub_job: str | None = None
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for a line: {WAIT_BOUND_TEXT}")
    follow: str | None = Field(
        default=None, description="1: a newline-delimited JSON stream until the job ends"
    )
    heartbeat: float = Field(
        default=10.0, ge=0, description="seconds of quiet between a followed stream's heartbeats"
    )


class RunLogsQuery(Query):
    cursor: Cursor = 0
    limit: int = Field(default=1000, ge=1, description="at most 5000")
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for news: {WAIT_BOUND_TEXT}")
