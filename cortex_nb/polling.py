"""Waiting on the backend: a request until it finishes, a job until it reaches a state, a job's progress
until it moves. Loops over the API layer's routes, paced by its `PollPolicy` (long polls by default)."""

from __future__ import annotations

import time
from typing import Any

from . import errors
from .api import Api, JobRow
from .protocol.states import JOB_RUNNING, JOB_TERMINAL, REQUEST_SUCCEEDED, REQUEST_TERMINAL
from .reconnect import Reconnect, backend_away
from .telemetry import recorded


@recorded("poll_request")
def poll_request(api: Api, job_id: str, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
    """Wait for a request to finish and return its result (with `tensors` decoded, if any).

    Raises `RequestFailed` (with the failure code) if it failed or was cancelled, and `TimeoutError` if
    waiting locally runs out; the request itself keeps running.
    """
    poll = api.poll
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else poll.timeout_s)
    intervals = poll.intervals()
    cursor = 0
    # Through a backend restart: the request is then found failed as `backend_restarted` (retryable).
    reconnect = Reconnect(poll.reconnect_s)
    while True:
        remaining = deadline - time.monotonic()
        wait_s = min(poll.long_poll_s, max(remaining, 0)) if poll.long_poll else 0.0
        try:
            status = api.get_request(job_id, request_id, cursor, wait_s)
        except errors.CortexError as exc:
            if not backend_away(exc) or time.monotonic() >= deadline:
                raise
            reconnect.wait(exc)
            continue
        reconnect.back()
        cursor = status["cursor"]
        if status["status"] in REQUEST_TERMINAL:
            return finished_result(api, job_id, status)
        if time.monotonic() >= deadline:
            raise errors.TimeoutError(
                f"request {request_id} is still {status['status']}; it keeps running. Poll again or cancel it.",
                code="timeout",
            )
        if not poll.long_poll:
            time.sleep(min(next(intervals), max(deadline - time.monotonic(), 0)))


def finished_result(api: Api, job_id: str, status: dict[str, Any]) -> dict[str, Any]:
    """A finished request's result (its tensors fetched), or `RequestFailed` with its code."""
    if status["status"] != REQUEST_SUCCEEDED:
        error = status.get("error") or {}
        raise errors.RequestFailed(
            f"{status['op']} request {status['request_id']} {status['status']}: {error.get('message', '')}".strip(),
            code=error.get("code", status["status"]),
            detail={"request": status},
        )
    result = dict(status.get("result") or {})
    if status.get("has_tensors"):
        result["tensors"] = api.get_request_tensors(job_id, status["request_id"])
    return result


@recorded("wait_for_job")
def wait_for_job(
    api: Api,
    job_id: str,
    until: tuple[str, ...] = (JOB_RUNNING, *JOB_TERMINAL),
    timeout_s: float | None = None,
) -> JobRow:
    """Wait until the job reaches one of `until` (default: running or finished)."""
    poll = api.poll
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else poll.timeout_s)
    intervals = poll.intervals()
    job = api.get_job(job_id)
    while job["status"] not in until:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise errors.TimeoutError(
                f"job {job_id} is still {job['status']} after waiting; it keeps going", code="timeout"
            )
        if poll.long_poll:
            job = api.get_job(job_id, wait_s=min(poll.long_poll_s, remaining), while_status=job["status"])
        else:
            time.sleep(min(next(intervals), remaining))
            job = api.get_job(job_id)
    return job


@recorded("wait_for_progress")
def wait_for_progress(api: Api, job_id: str, after: float | None, wait_s: float) -> JobRow:
    """The job once its progress record is newer than `after` (its `updated_at`), its status changes or
    its place in the queue moves, or after `wait_s`: one request per update."""
    return api.get_job(job_id, wait_s=wait_s, after_progress=after if after is not None else 0.0)
