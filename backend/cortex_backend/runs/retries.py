"""A source run's retry policy (`retry: {max, on, backoff_s}` in its spec): which failed attempt is tried
again, and the record each attempt leaves in the run's report.

An attempt counts as `worker_crashed` when a signal it did not send itself killed it (a kill from outside,
a segfault; not the CPU-time or file-size limits), `oom` when it failed `workload_out_of_memory`, and
`timeout` when it failed `timed_out`. Anything else (a non-zero exit, a missing output, a cancel, the
script gate) ends the run at once: running the same code again would fail the same way.
"""

from __future__ import annotations

import signal
from typing import Any

LIMIT_SIGNALS = {int(signal.SIGXCPU), int(signal.SIGXFSZ)}


def retry_reason(code: str | None, report: dict[str, Any]) -> str | None:
    """What the retry policy calls this failure (None: a failure no policy retries)."""
    if code == "workload_out_of_memory":
        return "oom"
    if code == "timed_out":
        return "timeout"
    if code == "workload_runtime_failed" and report.get("signal") is not None:
        return None if report["signal"] in LIMIT_SIGNALS else "worker_crashed"
    return None


def should_retry(spec: dict[str, Any], attempts: int, reason: str | None) -> bool:
    """Whether an attempt (the `attempts`-th) that failed for `reason` is tried again."""
    policy = spec.get("retry")
    return bool(policy) and reason is not None and reason in policy["on"] and attempts <= policy["max"]


def attempt_record(
    number: int,
    status: str,
    code: str | None,
    message: str | None,
    reason: str | None,
    started_at: float | None,
    finished_at: float,
    report: dict[str, Any],
) -> dict[str, Any]:
    return {
        "attempt": number,
        "status": status,
        "failure_code": code,
        "failure_message": message,
        "retry_reason": reason,
        "started_at": started_at,
        "finished_at": finished_at,
        "exit_code": report.get("exit_code"),
        "signal": report.get("signal"),
    }
