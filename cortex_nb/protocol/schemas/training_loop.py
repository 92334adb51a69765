"""A training run's loop: the `training_loop` of `POST /v1/jobs`, the JSON form of the
`%%cortex train` spec, and the parts it shares with the YAML form (`cortex_nb.train_spec`).

The data is named by the SHA-256 id of an uploaded dataset, `keep_alive` in seconds; the model, LoRA and
optimizer go in the job's training sub-job. A null key is "not given" (the YAML form leaves it out).
Refusals speak the spec's own words (`spec_errors`): "steps: must be >= 1, not 0".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..checkpoint_format import CHECKPOINT_TYPES, RESUMABLE
from ..errors import ApiError
from .base import SHA256_HEX, Body
from .spec_errors import SPEC_RULE, SpecError, parse_spec, spec_error

# What a backend restart does to a training run that was training or queued: resume it from its newest
# resumable checkpoint (`auto`), or fail it as `backend_restarted` (`never`).
RESUME_CHOICES = ("auto", "never")
DATASET_ID = re.compile(r"^[0-9a-f]{64}\Z")
# The longest keep-alive a spec may ask for: a week, like a job's idle timeout.
MAX_KEEP_ALIVE_S = 7 * 24 * 3600
# No count in a spec needs more; a bound keeps absurd values out of the loop's arithmetic.
MAX_INTEGER = 1 << 53

# What a training run may be retried on (each from its newest resumable checkpoint): its worker died
# (`worker_crashed`), its cluster host left (`host_lost`), or its device ran out of memory (`oom`).
RETRY_REASONS = ("worker_crashed", "host_lost", "oom")
MAX_RETRIES = 10
MAX_BACKOFF_S = 3600.0

Count = Annotated[int, Field(ge=1, le=MAX_INTEGER)]
Whole = Annotated[int, Field(ge=0, le=MAX_INTEGER)]
NonEmptyText = Annotated[str, StringConstraints(min_length=1)]
CheckpointType = Literal[CHECKPOINT_TYPES]  # type: ignore[valid-type]
Resume = Literal[RESUME_CHOICES]  # type: ignore[valid-type]


def _dataset_id(value: Any, handler: Any) -> str:
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            SPEC_RULE, "must be the SHA-256 hex of an uploaded dataset (PUT /v1/datasets/{dataset_id})"
        ) from None


class DatasetRef(Body):
    dataset_id: str = Field(pattern=SHA256_HEX, description="the SHA-256 of the uploaded JSONL")

    _check = field_validator("dataset_id", mode="wrap")(_dataset_id)


class EvalOnDataset(Body):
    """Held-out loss every `every` steps, on at most `max_rows` rows of an uploaded dataset."""

    every: Count
    dataset_id: str = Field(pattern=SHA256_HEX)
    max_rows: Count = 64

    _check = field_validator("dataset_id", mode="wrap")(_dataset_id)


class SampleSpec(Body):
    """Completions of `prompts` every `every` steps, shown with the loss curve."""

    every: Count
    prompts: Annotated[list[NonEmptyText], Field(min_length=1)] = Field(
        description="a string is taken as a list of one"
    )
    max_tokens: Count = 48
    temperature: float = Field(default=0.0, ge=0)

    @field_validator("prompts", mode="wrap")
    @classmethod
    def _non_empty_strings(cls, value: Any, handler: Any) -> Any:
        try:
            return handler([value] if isinstance(value, str) else value)
        except ValidationError:
            raise PydanticCustomError(SPEC_RULE, "must be a non-empty list of strings") from None


class SaveSpec(Body):
    """A checkpoint every `every` steps."""

    every: Count
    type: CheckpointType = RESUMABLE


class InitFrom(Body):
    """Start from a checkpoint of an earlier job: its adapter, and its optimizer state unless `optimizer`
    is false. The run's own steps count from 0."""

    job: NonEmptyText
    checkpoint: NonEmptyText
    optimizer: bool = True


class RetryPolicy(Body):
    """Up to `max` more attempts when one fails for a reason in `on`, each after `backoff_s` and from the
    run's newest resumable checkpoint."""

    max: int = Field(ge=1, le=MAX_RETRIES)
    on: list[str] = Field(default_factory=lambda: ["worker_crashed"], min_length=1)
    backoff_s: float = Field(default=10.0, ge=0, le=MAX_BACKOFF_S)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, raw: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true.
        if isinstance(raw, dict) and True in raw and "on" not in raw:
            raw = {("on" if key is True else key): value for key, value in raw.items()}
        return raw

    @field_validator("on")
    @classmethod
    def _reasons(cls, value: list[str]) -> list[str]:
        for reason in value:
            if reason not in RETRY_REASONS:
                hint = (
                    " (a training run has no time limit: only a source run can time out)"
                    if reason == "timeout"
                    else ""
                )
                raise PydanticCustomError(
                    SPEC_RULE, f"must hold only {', '.join(RETRY_REASONS)}, not {reason!r}{hint}"
                )
        return sorted(set(value), key=RETRY_REASONS.index)


class LoopRules(Body):
    """What both forms of the train spec say the same way: exactly one of steps and epochs. (The forms
    declare the fields themselves, so each lists its keys in its own order.)"""

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> LoopRules:
        if (getattr(self, "steps", None) is None) == (getattr(self, "epochs", None) is None):
            raise PydanticCustomError(
                SPEC_RULE,
                "give exactly one of steps: (optimizer steps) or epochs: (passes over the data)",
                {"field": "steps"},
            )
        return self

    def planned_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps this spec asks for, given how many batches one pass over the data makes."""
        steps, epochs = getattr(self, "steps", None), getattr(self, "epochs", None)
        if steps is not None:
            return steps
        return max(1, round(steps_per_epoch * float(epochs or 1)))


class TrainingLoop(LoopRules):
    """`training_loop` of `POST /v1/jobs`: a training run (docs/api.md, Managed training)."""

    missing_hints: ClassVar[dict[str, str]] = {
        "data": 'give {"dataset_id": "<sha256 of the uploaded JSONL>"}'
    }
    # The sections left out of the normalised form when not given.
    sections: ClassVar[tuple[str, ...]] = ("eval", "sample", "save", "init_from", "retry")

    data: DatasetRef
    eval: EvalOnDataset | None = None
    batch_size: Count = 8
    max_seq_len: int = Field(default=128, ge=2, le=MAX_INTEGER)
    packing: bool | None = Field(
        default=None,
        description="null: pack text rows, but keep each prompt/completion example in rows of its own",
    )
    steps: Count | None = Field(
        default=None, description="optimizer steps; give exactly one of steps, epochs"
    )
    epochs: float | None = Field(default=None, gt=0, description="passes over the data")
    sample: SampleSpec | None = None
    save: SaveSpec | None = None
    seed: Whole = 0
    keep_alive_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_KEEP_ALIVE_S,
        description="seconds the job stays up for sampling after training (0: it completes, freeing its device)",
    )
    init_from: InitFrom | None = None
    resume: Resume = Field(
        default="auto",
        description="after a backend restart: resume from the newest resumable checkpoint, or fail",
    )
    retry: RetryPolicy | None = Field(
        default=None, description="try a failed run again from its newest resumable checkpoint"
    )
    budget_device_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_INTEGER,
        description="device-seconds the run may use (as GET /v1/stats counts them); spent, it stops and saves `final`",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, raw: Any) -> Any:
        return (
            {key: value for key, value in raw.items() if value is not None} if isinstance(raw, dict) else raw
        )

    @classmethod
    def parse(cls, raw: Any) -> TrainingLoop:
        """`raw` (decoded JSON) as a loop, or the `SpecError` naming its first problem."""
        return parse_spec(cls, raw, cls.missing_hints)

    def normalised(self) -> dict[str, Any]:
        """The form a job stores and shows: every key with its value, sections only when given."""
        return self.model_dump(
            mode="json", exclude={name for name in self.sections if getattr(self, name) is None}
        )


def loop_refusal(exc: ValidationError) -> ApiError:
    """A refused `training_loop` of `POST /v1/jobs`: the spec's own line, under `training_loop`."""
    problem: SpecError = spec_error(exc, TrainingLoop, TrainingLoop.missing_hints)
    if problem.field is None:
        return ApiError("invalid_field", f"training_loop: {problem.message}", {"field": "training_loop"})
    field = f"training_loop.{problem.field}"
    if problem.message.startswith(problem.field):
        return ApiError("invalid_field", f"training_loop.{problem.message}", {"field": field})
    return ApiError("invalid_field", f"training_loop: {problem.message}", {"field": field})
