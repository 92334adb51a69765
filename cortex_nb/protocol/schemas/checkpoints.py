"""Checkpoints as listed, read and deleted. Their files and manifest are `..checkpoint_format`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ..checkpoint_format import CHECKPOINT_TYPES, EXPORT_ADAPTER, EXPORT_CONTENTS
from .base import Query, Reply


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


class CheckpointList(Reply):
    job_id: str
    checkpoints: list[CheckpointView] = Field(description="valid checkpoints, oldest first")


class DeletedCheckpoint(Reply):
    checkpoint_id: str
    job_id: str
    deleted: bool
    size_bytes: int


class ExportQuery(Query):
    contents: Literal[EXPORT_CONTENTS] = Field(  # type: ignore[valid-type]
        default=EXPORT_ADAPTER, description="adapter: the PEFT adapter directory; all: every file"
    )
