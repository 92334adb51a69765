"""Listing filters shared by `GET /v1/jobs` and `GET /v1/runs`, and `GET /v1/stats`: counts by state,
queue wait and device-seconds over a time window."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from .base import Query, Reply, ShortText

# "key" (the label is set) or "key=value" (it has this value); keys as `labels` take them.
LABEL_FILTER = r"^[a-z][a-z0-9_.-]{0,62}(=.{0,200})?$"
DEFAULT_STATS_WINDOW_S = 7 * 24 * 3600.0


class ListingQuery(Query):
    """Filters of a job or run listing, besides `status`, `limit` and `cursor`."""

    name: ShortText | None = Field(default=None, description="only those whose name contains this")
    since: float | None = Field(default=None, ge=0, description="created at or after (Unix seconds)")
    until: float | None = Field(default=None, ge=0, description="created before (Unix seconds)")
    label: Annotated[str, StringConstraints(pattern=LABEL_FILTER)] | None = Field(
        default=None, description="'key' (the label is set) or 'key=value'"
    )
    owner: ShortText | None = Field(
        default=None, description="whose (an admin's token: anyone's; any other token: only its own)"
    )


class StatsQuery(Query):
    since: float | None = Field(
        default=None, ge=0, description="window start, Unix seconds (default: 7 days before `until`)"
    )
    until: float | None = Field(default=None, ge=0, description="window end, Unix seconds (default: now)")
    owner: ShortText | None = Field(
        default=None, description="whose (an admin's token: anyone's or everyone's; any other: its own)"
    )


class StateCounts(Reply):
    total: int
    by_state: dict[str, int] = Field(description="jobs (or runs) created in the window, by status")


class QueueWait(Reply):
    count: int = Field(description="jobs and runs created in the window that have started")
    median_s: float | None
    p95_s: float | None = Field(description="nearest-rank 95th percentile")


class DeviceSeconds(Reply):
    total: float
    by_owner: dict[str, float]
    by_model: dict[str, float] = Field(
        description="a sub-job's seconds go to its base model; a source run's are split evenly between the"
        " models it stages, or go to '(none)'"
    )
    by_job: dict[str, float] = Field(
        default_factory=dict, description="per job with device time in the window (its sub-jobs' seconds)"
    )


class Stats(Reply):
    """`GET /v1/stats`."""

    since: float
    until: float
    owner: str | None = Field(description="whose work is counted (null: everyone's, for an admin)")
    jobs: StateCounts
    runs: StateCounts
    queue_wait: QueueWait
    device_seconds: DeviceSeconds = Field(
        description="time on devices inside the window: each sub-job holds one slot of one device, a run"
        " its devices; work still running counts up to now"
    )
