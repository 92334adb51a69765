"""Checkpoints as listed, read, kept and deleted (one by one or in bulk); an owner's checkpoint storage;
a job's lineage (step → checkpoint → exports, loads, samplers, weight syncs). Their files and manifest are
`..checkpoint_format`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..checkpoint_format import CHECKPOINT_TYPES, EXPORT_ADAPTER, EXPORT_CONTENTS
from .base import Body, Query, Reply, ShortText


class CheckpointView(Reply):
    checkpoint_id: str
    job_id: str
    sub_job_id: str
    type: Literal[CHECKPOINT_TYPES]  # type: ignore[valid-type]
    step: int
    created_at: float
    size_bytes: int
    base_model: str
    state_hash: str | None
    adapter: dict[str, Any] | None = Field(
        description="base_model, r, lora_alpha, target_modules, parameters"
    )
    files: list[str]
    expires_at: float | None = Field(default=None, description="when the backend deletes it; null: never")
    public: bool = Field(
        default=False, description="readable (loaded, sampled) by every token of the backend"
    )
    kept: bool = Field(default=False, description="marked keep: no bulk delete or expiry removes it")


class CheckpointUpdate(Body):
    """What PATCH changes: a field left out stays as it is."""

    body_name = "checkpoint"
    ttl_seconds: int | None = Field(
        default=None, description="expire this many seconds from now; null: never expire"
    )
    public: bool | None = Field(default=None, description="publish (true) or unpublish (false)")
    kept: bool | None = Field(
        default=None,
        description="true: no bulk delete or expiry removes it, and a plain delete is refused until false",
    )


class CheckpointCopy(Body):
    body_name = "copy"
    ttl_seconds: int | None = Field(default=None, description="the copy expires this many seconds from now")


class ListCheckpointsQuery(Query):
    type: Literal[CHECKPOINT_TYPES] | None = Field(  # type: ignore[valid-type]
        default=None, description="only checkpoints of this type"
    )
    kept: bool | None = Field(default=None, description="only kept (true) or only not kept (false)")
    min_step: int | None = Field(default=None, ge=0, description="only those saved at this step or later")
    max_step: int | None = Field(default=None, ge=0, description="only those saved at this step or before")
    created_before: float | None = Field(default=None, ge=0, description="only those created before (Unix s)")
    created_after: float | None = Field(
        default=None, ge=0, description="only those created at or after (Unix s)"
    )


class CheckpointList(Reply):
    job_id: str
    checkpoints: list[CheckpointView] = Field(description="valid checkpoints, oldest first")


class DeletedCheckpoint(Reply):
    checkpoint_id: str
    job_id: str
    deleted: bool
    size_bytes: int


class PruneCheckpoints(Body):
    """`POST /v1/jobs/{job_id}/prune_checkpoints`: delete a job's checkpoints in bulk."""

    body_name = "prune"
    keep_final: bool = Field(default=True, description="spare the checkpoint named `final`")
    older_than_s: float | None = Field(
        default=None, ge=0, description="only those created more than this many seconds ago (default: all)"
    )
    dry_run: bool = Field(default=False, description="answer what would be deleted, delete nothing")


class SparedCheckpoint(Reply):
    checkpoint_id: str
    reason: Literal["final", "kept", "in_use", "newer"] = Field(
        description="final: named final (keep_final); kept: marked keep; in_use: a load or export reads it;"
        " newer: created within older_than_s"
    )


class PrunedCheckpoints(Reply):
    job_id: str
    dry_run: bool
    deleted: list[str] = Field(description="checkpoints deleted (or, on a dry run, that would be)")
    freed_bytes: int
    spared: list[SparedCheckpoint]


class StorageQuery(Query):
    owner: ShortText | None = Field(
        default=None, description="whose (an admin's token: anyone's, or everyone's; any other: its own)"
    )


class JobStorage(Reply):
    job_id: str
    name: str | None
    status: str
    checkpoint_count: int
    kept_count: int
    size_bytes: int


class OwnerStorage(Reply):
    owner: str
    used_bytes: int = Field(description="bytes the owner's checkpoints take on disk")
    quota_bytes: int | None = Field(description="the backend's --checkpoint-quota-bytes; null: no quota")
    checkpoint_count: int
    jobs: list[JobStorage] = Field(description="jobs holding checkpoints, largest first")


class StorageView(Reply):
    """`GET /v1/storage`."""

    owners: list[OwnerStorage]


class CheckpointUse(Reply):
    """A load of the checkpoint into a sub-job, or a generate that sampled it as a saved adapter."""

    job_id: str
    sub_job_id: str
    request_id: str
    op: Literal["load", "generate", "forward"]
    status: str
    at: float


class CheckpointExport(Reply):
    at: float
    contents: str


class CheckpointLineage(Reply):
    checkpoint_id: str
    step: int
    type: str
    size_bytes: int
    kept: bool
    created_at: float
    exports: list[CheckpointExport]
    uses: list[CheckpointUse] = Field(
        description="loads into sub-jobs, and samplings of it as a saved adapter"
    )


class WeightSyncRecord(Reply):
    request_id: str
    at: float
    status: str
    targets: list[str] | None = Field(
        description="the sampling sub-jobs that got the weights (before it succeeds: those asked; null: all)"
    )
    format: str | None
    result: dict[str, Any] | None = Field(
        description="path (delta or full), weight_version (the trainer's step sent), bytes, source_hash"
    )


class LineageOrigin(Reply):
    """A checkpoint of another job that a job's weights came from."""

    via: Literal["load", "init_from", "copy"] = Field(
        description="a load into one of its sub-jobs, its training run's init_from, or a checkpoint copy"
    )
    job_id: str = Field(description="the job that took the weights (this one, or an origin's job)")
    source_job_id: str
    source_name: str | None = Field(description="the source job's name; null if this token may not see it")
    checkpoint_id: str
    step: int | None = Field(description="the checkpoint's step; null once it was deleted")
    checkpoint_exists: bool
    request_id: str | None = Field(description="the load request (null for init_from and copy)")
    sub_job_id: str | None = Field(description="the sub-job loaded into (null for init_from and copy)")
    at: float
    exports: list[CheckpointExport] = Field(description="each export of the source checkpoint")


class JobLineage(Reply):
    """`GET /v1/jobs/{job_id}/lineage`: job → step → checkpoint → exports, loads and samplings; weight syncs."""

    job_id: str
    name: str | None
    status: str
    step: int | None = Field(description="the step training reached (the progress record), or null")
    size_bytes: int = Field(description="bytes of all its checkpoints")
    checkpoints: list[CheckpointLineage] = Field(description="oldest first")
    weight_syncs: list[WeightSyncRecord]
    origins: list[LineageOrigin] = Field(
        description="where its weights came from, nearest first, then where those came from (at most 64)"
    )


class ExportQuery(Query):
    contents: Literal[EXPORT_CONTENTS] = Field(  # type: ignore[valid-type]
        default=EXPORT_ADAPTER, description="adapter: the PEFT adapter directory; all: every file"
    )
