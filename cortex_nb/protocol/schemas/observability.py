"""Device metrics (a job's, the host's) and the event feed of job and request state changes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import WAIT_BOUND_TEXT, Cursor, Query, Reply, Seconds, WaitSeconds
from .meta import DeviceView


class RankReading(Reply):
    """One rank's worker of a sub-job across devices (`n_gpus` > 1), read on its own."""

    sub_job_id: str
    rank: int
    cpu_percent: float = Field(description="this rank's worker process, on the host's scale")
    ram_bytes: int = Field(description="this rank's worker process's resident memory")


class MetricSample(Reply):
    """One monitor sample of one device. Fields a host cannot measure are absent, never zero."""

    at: float
    device: str | None = None
    host: str | None = Field(default=None, description="the host that took it, on a Ray backend")
    gpu_utilization_percent: float | None = None
    gpu_memory_used_bytes: int | None = None
    gpu_memory_total_bytes: int | None = None
    gpu_temperature_c: float | None = None
    gpu_power_watts: float | None = None
    cpu_percent: float | None = Field(default=None, description="the host's")
    ram_used_bytes: int | None = Field(default=None, description="the host's")
    ram_total_bytes: int | None = None
    sub_job_ids: list[str] | None = Field(default=None, description="this job's sub-jobs on the device then")
    job_cpu_percent: float | None = Field(
        default=None, description="this job's worker processes, on the host's scale"
    )
    job_ram_bytes: int | None = Field(
        default=None, description="this job's worker processes' resident memory"
    )
    job_ranks: list[RankReading] | None = Field(
        default=None,
        description="each rank on this device of this job's sub-jobs across devices (in the job_ figures too)",
    )


class JobMetrics(Reply):
    samples: list[MetricSample]
    next_since: float
    devices: list[str]
    interval_s: float
    gpu_unavailable_reason: str | None
    gpu_metrics_note: str | None


class HostMetrics(Reply):
    samples: list[MetricSample]
    next_since: float
    devices: list[DeviceView]
    interval_s: float
    gpu_unavailable_reason: str | None
    gpu_metrics_note: str | None


class JobMetricsQuery(Query):
    since: Seconds = 0.0
    limit: int = Field(default=1000, ge=1, description="at most 10000")


class HostMetricsQuery(Query):
    since: Seconds = 0.0


class Event(Reply):
    seq: int
    at: float
    kind: Literal["job", "request"]
    job_id: str
    status: str
    request_id: str | None = None
    sub_job_id: str | None = None
    op: str | None = None
    failure_code: str | None = None


class EventPage(Reply):
    events: list[Event]
    cursor: int


class EventsQuery(Query):
    after: Cursor = 0
    limit: int = Field(default=100, ge=1, description="at most 1000")
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for news: {WAIT_BOUND_TEXT}")
