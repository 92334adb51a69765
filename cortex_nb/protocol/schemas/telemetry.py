"""Client telemetry records (`POST /v1/telemetry`): which operations and error types a record may
name, and the bounds the backend holds them to (every field that becomes a metric label is bounded)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from .base import Body, Query, Reply

# The operations that are recorded. The backend counts anything else as "other", keeping /metrics bounded.
ESSENTIAL_OPERATIONS = frozenset(
    {
        "check_version",
        "create_job",
        "get_job",
        "list_jobs",
        "wait_for_job",
        "wait_for_progress",
        "cancel_job",
        "complete_job",
        "forward_backward",
        "forward",
        "step",
        "generate",
        "poll_request",
        "cancel_request",
        "tail_logs",
        "download_stdout_logs",
        "get_job_metrics",
        "download_metrics",
        "list_events",
    }
)
# Error types the backend accepts as labels (the client's exception classes, plus interruption).
ERROR_TYPES = frozenset(
    {
        "CortexError",
        "ApiError",
        "BadRequestError",
        "AuthError",
        "PermissionError",
        "NotFoundError",
        "ConflictError",
        "RateLimitError",
        "BackendError",
        "ConnectionError",
        "RequestFailed",
        "TimeoutError",
        "VersionMismatchError",
        "KeyboardInterrupt",
        "ValueError",
        "TypeError",
        "OSError",
    }
)
MAX_MESSAGE_CHARS = 500
# Records per POST: the client batches up to this many, the backend refuses more.
MAX_RECORDS_PER_POST = 100


class TelemetryBatch(Body):
    """`POST /v1/telemetry`: records of client operations. Each record is checked on its own and one the
    backend cannot read is counted as rejected, never refusing the others."""

    records: Annotated[list[Any], Field(max_length=MAX_RECORDS_PER_POST)]


class TelemetryAccepted(Reply):
    accepted: int


class TelemetryRecord(Reply):
    operation: str
    success: bool
    duration_ms: float
    attempts: int
    retries: int
    http_status: int | None
    error_type: str | None
    error_code: str | None = None
    message: str | None = None
    client_version: str | None
    owner: str
    received_at: float


class TelemetryRecords(Reply):
    records: list[TelemetryRecord]


class RecentTelemetryQuery(Query):
    limit: int = Field(default=100, ge=1, description="at most 1000")
