"""Source runs: a user's own code on the backend host (the `cortex.yaml` run spec is `cortex_nb.run_spec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..states import JOB_STATES
from .base import Body, Identifier, Query, Reply, Seconds

JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]


class ArchiveRef(Body):
    upload_id: str
    sha256: str


class CreateRun(Body):
    """`POST /v1/runs`: the spec, the SHA-256 manifest of its files, and the uploaded archive holding them."""

    submission_id: Identifier | None = Field(default=None, description="a submission id never runs twice")
    spec: dict[str, Any] = Field(
        description="the run spec (docs/run-spec.md), checked by cortex_nb/run_spec.py"
    )
    manifest: list[dict[str, Any]] = Field(
        default_factory=list, description="{path, bytes, sha256, kind} per file"
    )
    archive: ArchiveRef | None = Field(
        default=None, description="the uploaded tar (PUT /v1/runs/uploads/...)"
    )


class RunView(Reply):
    run_id: str
    submission_id: str
    owner: str
    name: str | None
    status: JobStatus
    failure_code: str | None
    failure_message: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    devices: list[str]
    isolation_tier: str | None
    exit_code: int | None
    spec: dict[str, Any]
    outputs: dict[str, Any]


class RunPage(Reply):
    runs: list[RunView]
    next_cursor: str | None


class RunReport(Reply):
    run_id: str
    status: JobStatus
    failure_code: str | None
    failure_message: str | None
    started_at: float | None
    finished_at: float | None
    exit_code: int | None = None
    signal: int | None = None
    wall_seconds: float | None = None
    device_seconds: float | None = None
    device_kind: str | None = None
    devices: list[str] | None = None
    gpu_count: int | None = None
    cpu_seconds: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: Literal["cgroup", "largest_process"] | None = Field(
        default=None, description="the run's cgroup peak, or (without a cgroup) its largest process's"
    )
    outputs_bytes: int | None = None
    isolation_tier: str | None = None
    isolation: dict[str, Any] | None = None
    unenforced: list[str] | None = Field(
        default=None, description="the limits this host did not enforce (docs/security.md)"
    )
    run_uid: int | None = Field(
        default=None, description="the dedicated uid the run ran as (none: the backend's own)"
    )
    limits: dict[str, Any] | None = None


class RunOutput(Reply):
    name: str
    path: str
    max_bytes: int
    required: bool
    collected: bool
    bytes: int | None
    sha256: str | None


class RunOutputs(Reply):
    run_id: str
    status: JobStatus
    outputs: list[RunOutput]


class ListRunsQuery(Query):
    status: JobStatus | None = None
    limit: int = Field(default=50, ge=1, description="at most 500 are returned")
    cursor: str | None = None
    submission_id: str | None = None


class GetRunQuery(Query):
    wait: Seconds = 0.0
    while_status: JobStatus | None = None
