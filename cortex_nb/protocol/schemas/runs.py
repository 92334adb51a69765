"""Source runs: a user's own code on the backend host (the `cortex.yaml` run spec is `run_spec.RunSpec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from ..priority import DEFAULT_PRIORITY
from ..states import JOB_STATES
from .base import SHA256_HEX, WAIT_BOUND_TEXT, Body, Identifier, Query, Reply, WaitSeconds
from .run_spec import RunSpec, run_spec_refusal
from .stats import ListingQuery

JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]


class ArchiveRef(Body):
    upload_id: str
    sha256: str


class ManifestEntry(Body):
    """One file of a run's upload. Its shape is checked here; the rules between entries and against the spec
    (a clean relative path, no duplicates, limits, inputs the spec names) where the run is taken in."""

    path: str = Field(min_length=1, max_length=512, description="where it goes, relative to the work dir")
    bytes: int = Field(ge=0, description="its size")
    sha256: str = Field(pattern=SHA256_HEX, description="its SHA-256, hex")
    kind: Literal["source", "input"] = Field(
        default="source", description="`input`: a file the spec's `inputs` names; `source`: the rest"
    )


class CreateRun(Body):
    """`POST /v1/runs`: the spec, the SHA-256 manifest of its files, and the uploaded archive holding them."""

    submission_id: Identifier | None = Field(default=None, description="a submission id never runs twice")
    spec: RunSpec = Field(description="the run spec (docs/run-spec.md); its refusals name fields within it")
    manifest: list[ManifestEntry] = Field(default_factory=list, description="one entry per file")
    archive: ArchiveRef | None = Field(
        default=None, description="the uploaded tar (PUT /v1/runs/uploads/...)"
    )

    @field_validator("spec", mode="wrap")
    @classmethod
    def _spec_in_its_own_words(cls, value: Any, handler: Any) -> Any:
        # The ApiError (`spec_invalid`, the field within the spec) is not a ValueError: it leaves
        # validation as it is.
        try:
            return handler(value)
        except ValidationError as exc:
            raise run_spec_refusal(exc) from None


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
    priority: int = Field(default=DEFAULT_PRIORITY, description="its queue band (0-9, higher first)")
    labels: dict[str, str] = Field(default_factory=dict)


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
    script_gate: ScriptGateReport | None = Field(
        default=None, description="absent when --run-script-gate is off"
    )
    attempts: list[RunAttempt] | None = Field(
        default=None, description="each attempt so far, with a retry policy in the spec (docs/run-spec.md)"
    )


class ScriptFinding(Reply):
    path: str = Field(description="relative to the work dir")
    line: int
    rule: str = Field(description="ctypes, shell, network, write_outside_workdir or unparsable")
    message: str


class ScriptGateReport(Reply):
    """What the script gate found before the run started (docs/security.md: defence in depth)."""

    mode: Literal["strict", "warn"]
    files_scanned: int
    refused: bool
    findings: list[ScriptFinding]


class RunAttempt(Reply):
    """One attempt of a run with a retry policy."""

    attempt: int
    status: JobStatus
    failure_code: str | None
    failure_message: str | None
    retry_reason: str | None = Field(description="worker_crashed, oom or timeout when the policy knows it")
    started_at: float | None
    finished_at: float
    exit_code: int | None
    signal: int | None


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


class ListRunsQuery(ListingQuery):
    status: JobStatus | None = None
    limit: int = Field(default=50, ge=1, description="at most 500 are returned")
    cursor: str | None = None
    submission_id: str | None = None


class GetRunQuery(Query):
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for news: {WAIT_BOUND_TEXT}")
    while_status: JobStatus | None = None
