"""The `cortex.yaml` run spec of a source run (docs/run-spec.md): the `spec` of `POST /v1/runs`.

Checked by the client before any upload and by the backend (the authority), with this one model. A
refusal is `spec_invalid` with `detail.field` naming the offending key relative to the spec (dotted:
`outputs.metrics.max_bytes`). Unknown keys are refused, never ignored. What needs the backend (are the
models registered, does the host have the GPUs) is checked by the service.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import ApiError
from ..model_names import is_model_name
from ..priority import MAX_PRIORITY, MIN_PRIORITY
from .base import Body, refusal

SPEC_VERSION = 1
ISOLATION_REQUIRED = "required"
ISOLATION_BEST_EFFORT = "best_effort"
ISOLATION_MODES = (ISOLATION_REQUIRED, ISOLATION_BEST_EFFORT)

MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_INPUT_BYTES = 512 * MIB
MAX_INPUTS = 16
MAX_OUTPUT_BYTES = 128 * MIB
DEFAULT_OUTPUT_BYTES = 8 * MIB
MAX_OUTPUTS_TOTAL_BYTES = 1 * GIB
MAX_OUTPUTS = 32
MAX_SOURCE_FILES = 1000
MAX_SOURCE_BYTES = 64 * MIB
MAX_INCLUDES = 64
MAX_MODELS = 8
MAX_GPUS = 64
MAX_COMMAND_ARGS = 256
DEFAULT_TIMEOUT_S = 3600
MAX_TIMEOUT_S = 7 * 24 * 3600
# Where staged models appear in the work dir; no source file or output may live there.
MODELS_DIR = "models"
# What a source run may be retried on: killed by a signal it did not send itself, out of memory, timed out.
RETRY_REASONS = ("worker_crashed", "oom", "timeout")
MAX_RETRIES = 10
MAX_BACKOFF_S = 3600
MAX_LABELS = 16

# \Z, not $: "$" also matches before a trailing newline.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
LABEL_KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,62}\Z")
NAME_RULE = "1-64 letters, digits, '_', '.', '-', starting with a letter or digit"


def spec_error(field: str, message: str) -> ApiError:
    return ApiError("spec_invalid", f"{field}: {message}", {"field": field})


def relative_path(value: Any, field: str) -> str:
    """A clean relative POSIX path inside the work dir (no '..', no absolute path, not under models/)."""
    if not isinstance(value, str) or not value.strip():
        raise spec_error(field, "must be a non-empty relative path")
    if "\\" in value or "\0" in value or value.startswith("/"):
        raise spec_error(field, f"must be a relative path with '/' separators, got {value!r}")
    normal = posixpath.normpath(value)
    parts = normal.split("/")
    if normal in (".", "") or ".." in parts:
        raise spec_error(field, f"must stay inside the work dir, got {value!r}")
    if parts[0] == MODELS_DIR:
        raise spec_error(field, f"'{MODELS_DIR}/' is where models are staged; choose another path")
    if len(normal) > 512:
        raise spec_error(field, "is longer than 512 characters")
    return normal


class Source(Body):
    include: Annotated[list[str], Field(max_length=MAX_INCLUDES)] = Field(
        default_factory=list, description="relative glob patterns of the files to send"
    )

    @field_validator("include")
    @classmethod
    def _relative_globs(cls, value: list[str]) -> list[str]:
        for index, pattern in enumerate(value):
            field = f"source.include[{index}]"
            if not pattern.strip():
                raise spec_error(field, "must be a non-empty glob pattern")
            if pattern.startswith("/") or "\\" in pattern or ".." in pattern.split("/"):
                raise spec_error(field, f"must be a relative glob inside the spec's folder, got {pattern!r}")
        return value


class InputEntry(Body):
    path: str = Field(description="where the file appears in the work dir")


class OutputEntry(Body):
    path: str = Field(description="where the run writes it, relative to the work dir")
    max_bytes: int = Field(default=DEFAULT_OUTPUT_BYTES, ge=1, le=MAX_OUTPUT_BYTES)
    required: bool = Field(default=True, description="a missing required output fails the run")


class Gpu(Body):
    count: int = Field(default=0, ge=0, le=MAX_GPUS)
    min_vram_gib: float = Field(default=0, ge=0, le=4096)


class Resources(Body):
    gpu: Gpu = Field(default_factory=Gpu)


class Retry(Body):
    """Up to `max` more attempts when an attempt fails for a reason in `on`."""

    max: int = Field(ge=1, le=MAX_RETRIES, description="how many more attempts")
    on: Annotated[list[Literal[RETRY_REASONS]], Field(min_length=1)] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["worker_crashed"]
    )
    backoff_s: float = Field(default=10, ge=0, le=MAX_BACKOFF_S)

    @field_validator("on", mode="wrap")
    @classmethod
    def _known_reasons(cls, value: Any, handler: Any) -> list[str]:
        if isinstance(value, list) and "host_lost" in value:
            raise spec_error(
                f"retry.on[{value.index('host_lost')}]",
                f"must be one of {list(RETRY_REASONS)}, got 'host_lost' (a source run runs on the backend's"
                " own host: it has no host to lose)",
            )
        return sorted(set(handler(value)), key=RETRY_REASONS.index)


Command = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[str], Field(min_length=1, max_length=MAX_COMMAND_ARGS)]
)


def _bare_path(entries: Any) -> Any:
    """An input or output given as a bare path is `{path: ...}`."""
    if isinstance(entries, dict):
        return {name: {"path": entry} if isinstance(entry, str) else entry for name, entry in entries.items()}
    return entries


class RunSpec(Body):
    """A `cortex.yaml` (docs/run-spec.md)."""

    version: Literal[SPEC_VERSION] = Field(description=f"always {SPEC_VERSION}")  # type: ignore[valid-type]
    name: str = Field(pattern=NAME_PATTERN.pattern.replace("\\Z", "$"), description=NAME_RULE)
    source: Source = Field(default_factory=Source)
    command: Command = Field(description="a string run by /bin/sh -c, or a list of arguments")
    models: Annotated[list[str], Field(max_length=MAX_MODELS)] = Field(
        default_factory=list, description="registered model names, staged read-only under models/"
    )
    inputs: Annotated[dict[str, InputEntry], Field(max_length=MAX_INPUTS)] = Field(
        default_factory=dict, description="name -> a file sent with the run (a bare path is {path})"
    )
    outputs: Annotated[dict[str, OutputEntry], Field(max_length=MAX_OUTPUTS)] = Field(
        default_factory=dict, description="name -> a file collected after the run (a bare path is {path})"
    )
    resources: Resources = Field(default_factory=Resources)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=MAX_TIMEOUT_S)
    isolation: Literal[ISOLATION_MODES] = ISOLATION_BEST_EFFORT  # type: ignore[valid-type]
    priority: int | None = Field(default=None, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    labels: (
        Annotated[dict[str, Annotated[str, Field(max_length=200)]], Field(max_length=MAX_LABELS)] | None
    ) = Field(default=None, description="free-form labels to find runs by; they never decide who sees a run")
    retry: Retry | None = None

    @model_validator(mode="before")
    @classmethod
    def _version_first(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            if not raw:
                raise spec_error("version", "the spec is empty; it needs at least version, name and command")
            if "version" not in raw:
                raise spec_error("version", f"is required; use {SPEC_VERSION}")
            if raw["version"] != SPEC_VERSION or isinstance(raw["version"], bool):
                raise spec_error("version", f"must be {SPEC_VERSION}, got {raw['version']!r}")
            if not isinstance(raw.get("name"), str) or not NAME_PATTERN.match(raw["name"]):
                raise spec_error("name", f"is required: {NAME_RULE}")
            if "command" not in raw:
                raise spec_error("command", "is required, e.g. ['python', 'main.py']")
        return raw

    _bare_paths = field_validator("inputs", "outputs", mode="before")(_bare_path)

    @field_validator("command", mode="wrap")
    @classmethod
    def _command(cls, value: Any, handler: Any) -> str | list[str]:
        if isinstance(value, str):
            if not value.strip():
                raise spec_error("command", "must not be empty")
            if "\0" in value:
                raise spec_error("command", "must not contain NUL")
        elif isinstance(value, list) and value:
            if len(value) > MAX_COMMAND_ARGS:
                raise spec_error("command", f"has more than {MAX_COMMAND_ARGS} arguments")
            for index, arg in enumerate(value):
                if not isinstance(arg, str) or "\0" in arg:
                    raise spec_error(f"command[{index}]", f"must be a string, got {arg!r}")
        else:
            raise spec_error(
                "command", "must be a string (run by /bin/sh -c) or a non-empty list of arguments"
            )
        return handler(value)

    @model_validator(mode="after")
    def _cross_checks(self) -> RunSpec:
        # Errors that name a field of their own leave validation as ApiErrors (not ValueErrors).
        for index, model in enumerate(self.models):
            if not is_model_name(model):
                raise spec_error(
                    f"models[{index}]",
                    f"must be the name of a registered model (GET /v1/models), got {model!r}",
                )
            if model in self.models[:index]:
                raise spec_error(f"models[{index}]", f"{model!r} is listed twice")
        for kind, entries in (("input", self.inputs), ("output", self.outputs)):
            for name, entry in entries.items():
                _check_entry(kind, name, entry)
        _no_duplicate_paths(self.inputs, "inputs")
        _no_duplicate_paths(self.outputs, "outputs")
        total = sum(entry.max_bytes for entry in self.outputs.values())
        if total > MAX_OUTPUTS_TOTAL_BYTES:
            raise spec_error(
                "outputs",
                f"max_bytes add up to {total} bytes; all outputs together may be at most {MAX_OUTPUTS_TOTAL_BYTES}",
            )
        for key in self.labels or {}:
            if not LABEL_KEY_PATTERN.match(key):
                raise spec_error(
                    "labels", f"label names are lower-case letters, digits, '_', '.', '-', got {key!r}"
                )
        return self

    @classmethod
    def parse(cls, raw: Any) -> RunSpec:
        """`raw` (decoded YAML or JSON) as a spec, or the `spec_invalid` ApiError naming its field."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise run_spec_refusal(exc) from None

    def normalised(self) -> dict[str, Any]:
        """The form a run stores and shows: defaults filled in, paths cleaned; `priority`, `labels` and
        `retry` only when given, so a resubmitted spec compares equal to the stored one."""
        return self.model_dump(
            mode="json",
            exclude={key for key in ("priority", "labels", "retry") if getattr(self, key) is None},
        )


def _check_entry(kind: str, name: str, entry: InputEntry | OutputEntry) -> None:
    """One input or output: a checked name, and its path made relative and safe."""
    field = f"{kind}s.{name}"
    if not NAME_PATTERN.match(name):
        raise spec_error(field, f"{kind} names are 1-64 letters, digits, '_', '.', '-'")
    entry.path = relative_path(entry.path, f"{field}.path")


def _no_duplicate_paths(entries: dict[str, Any], field: str) -> None:
    seen: dict[str, str] = {}
    for name, entry in entries.items():
        if entry.path in seen:
            raise spec_error(f"{field}.{name}.path", f"is the same path as {field}.{seen[entry.path]}")
        seen[entry.path] = name


def run_spec_refusal(exc: ValidationError) -> ApiError:
    """The first problem of a refused spec, as `spec_invalid` naming its field within the spec."""
    problem = refusal(exc, RunSpec)
    return ApiError("spec_invalid", problem.message, problem.detail)
