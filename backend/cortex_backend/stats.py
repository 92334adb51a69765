"""`GET /v1/stats`: what the store says about a window of time, computed in one place.

- counts by state: jobs (and runs) *created* in [since, until), so they match a listing with the same
  `since`/`until`;
- queue wait: started_at - created_at of those that have started, median and nearest-rank p95;
- device-seconds: time on devices *inside* the window (work still running counts up to now): a job's
  sub-jobs each hold one slot of one device from the job's start to its end; a run holds its devices
  (at least one), as its report counts them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from typing import Any

from .store import Store

NO_MODEL = "(none)"


def nearest_rank(values: list[float], percent: float) -> float | None:
    """The smallest value with at least `percent`% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]


def _overlap(start: float | None, end: float | None, since: float, until: float, now: float) -> float:
    if start is None:
        return 0.0
    return max(0.0, min(end if end is not None else now, until) - max(start, since))


def job_device_seconds(job: dict[str, Any], now: float | None = None) -> float:
    """A job's device-seconds so far: each of its sub-jobs holds one slot of one device from each start to
    the matching stop (a preemption, a parking, a retry, a restart: `held_seconds`) and from its latest
    start to its end (or now). What a run's budget is spent against, and what `%cortex usage` totals."""
    now = time.time() if now is None else now
    held = _overlap(job["started_at"], job["finished_at"], 0.0, math.inf, now)
    return (float(job.get("held_seconds") or 0.0) + held) * len(job.get("sub_jobs") or ())


def span_closed(job: dict[str, Any], end: float | None = None) -> dict[str, Any]:
    """The fields that close a job's current span on its devices before it goes back to the queue: its
    time folded into `held_seconds`, `started_at` cleared (the next start opens a new span)."""
    if job.get("started_at") is None:
        return {}
    end = time.time() if end is None else end
    held = float(job.get("held_seconds") or 0.0) + max(0.0, end - job["started_at"])
    return {"held_seconds": held, "started_at": None}


def compute_stats(store: Store, owner: str | None, since: float, until: float) -> dict[str, Any]:
    now = time.time()
    jobs, subs, runs = store.work_for_stats(owner, since, until)
    created = [row for row in (*jobs, *runs) if since <= row["created_at"] < until]
    waits = [row["started_at"] - row["created_at"] for row in created if row["started_at"] is not None]
    by_owner: dict[str, float] = defaultdict(float)
    by_model: dict[str, float] = defaultdict(float)
    by_job: dict[str, float] = defaultdict(float)
    job_by_id = {job["id"]: job for job in jobs}
    for sub in subs:
        job = job_by_id[sub["job_id"]]
        seconds = _overlap(job["started_at"], job["finished_at"], since, until, now)
        if since <= job["created_at"] < until:
            # Earlier spans (before a preemption, parking, retry or restart) are kept as one sum, counted
            # in the window the job was created in.
            seconds += float(job.get("held_seconds") or 0.0)
        by_owner[job["owner"]] += seconds
        by_model[sub["model"] or NO_MODEL] += seconds
        by_job[job["id"]] += seconds
    for run in runs:
        seconds = _overlap(run["started_at"], run["finished_at"], since, until, now) * max(
            1, len(run["devices"])
        )
        by_owner[run["owner"]] += seconds
        models = run["models"] or [NO_MODEL]
        for model in models:
            by_model[model] += seconds / len(models)
    return {
        "since": since,
        "until": until,
        "owner": owner,
        "jobs": _counts(row["status"] for row in jobs if since <= row["created_at"] < until),
        "runs": _counts(row["status"] for row in runs if since <= row["created_at"] < until),
        "queue_wait": {
            "count": len(waits),
            "median_s": statistics.median(waits) if waits else None,
            "p95_s": nearest_rank(waits, 95),
        },
        "device_seconds": {
            "total": round(sum(by_owner.values()), 3),
            "by_owner": {name: round(value, 3) for name, value in sorted(by_owner.items())},
            "by_model": {name: round(value, 3) for name, value in sorted(by_model.items())},
            "by_job": {name: round(value, 3) for name, value in sorted(by_job.items()) if value > 0},
        },
    }


def _counts(statuses) -> dict[str, Any]:
    counts = Counter(statuses)
    return {"total": sum(counts.values()), "by_state": dict(sorted(counts.items()))}
