"""Client telemetry on the backend: validate reported records, count them into /metrics, and keep the
last few (redacted again, in case a client did not) for an operator to read.

Every field that becomes a metric label is bounded here: unknown operations and error types count
as "other", so a misbehaving client cannot blow up the metric series.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from cortex_nb.protocol.redaction import bounded
from cortex_nb.protocol.schemas.telemetry import (
    ERROR_TYPES,
    ESSENTIAL_OPERATIONS,
    MAX_MESSAGE_CHARS,
)

from .auth import Principal
from .operator_metrics import OperatorMetrics

RECENT_KEPT = 1000


def _label(value: Any, allowed: frozenset[str]) -> str:
    return value if isinstance(value, str) and value in allowed else "other"


def _count(value: Any, field: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 10_000:
        raise ValueError(field)
    return value


def clean_record(raw: Any) -> dict[str, Any]:
    """A record with bounded, typed fields; raises ValueError naming the bad field."""
    if not isinstance(raw, dict):
        raise ValueError("record")
    success = raw.get("success")
    if not isinstance(success, bool):
        raise ValueError("success")
    duration = raw.get("duration_ms")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e10:
        raise ValueError("duration_ms")
    status = raw.get("http_status")
    if status is not None and (
        isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599
    ):
        raise ValueError("http_status")
    record = {
        "operation": _label(raw.get("operation"), ESSENTIAL_OPERATIONS),
        "success": success,
        "duration_ms": float(duration),
        "attempts": _count(raw.get("attempts"), "attempts"),
        "retries": _count(raw.get("retries"), "retries"),
        "http_status": status,
        "error_type": None if success else _label(raw.get("error_type"), ERROR_TYPES),
    }
    if not success:
        code = raw.get("error_code")
        record["error_code"] = bounded(code, 64) if isinstance(code, str) else None
        message = raw.get("message")
        record["message"] = bounded(message, MAX_MESSAGE_CHARS) if isinstance(message, str) else None
    version = raw.get("client_version")
    record["client_version"] = bounded(version, 32) if isinstance(version, str) else None
    return record


class TelemetrySink:
    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_KEPT)

    def receive(self, principal: Principal, records: list[Any]) -> int:
        """Count and keep the records that read well (the batch's shape was checked by its schema)."""
        accepted = 0
        received_at = time.time()
        for raw in records:
            try:
                record = clean_record(raw)
            except ValueError:
                self.metrics.telemetry_rejected.inc()
                continue
            self.metrics.observe_client_operation(record)
            self.recent.append({**record, "owner": principal.owner, "received_at": received_at})
            accepted += 1
        return accepted

    def latest(self, limit: int) -> list[dict[str, Any]]:
        return list(self.recent)[-limit:]
