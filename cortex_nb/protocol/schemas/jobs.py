"""Jobs: what `POST /v1/jobs` takes, and the job row every job route (and each row of a listing) answers
with, including the backend-owned progress record, why a job waits and when it frees its device.

What needs the backend's model catalog (does the model exist, does it have these LoRA modules, does
max_seq_len fit it) is checked by the service; the rest is here. A training run's
`training_loop` is `TrainingLoop` (the `%%cortex train` spec's JSON form), refused in the spec's words.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from ..states import (
    JOB_STATES,
    PROGRESS_MANAGED,
    PROGRESS_PHASES,
    PROGRESS_PRIMITIVE,
    SAMPLING,
    SUB_JOB_TYPES,
    TRAINING,
)
from .base import (
    LABEL_KEY,
    MODULE_NAME,
    WAIT_BOUND_TEXT,
    Body,
    Identifier,
    Query,
    Reply,
    Seed,
    ShortText,
    WaitSeconds,
)
from .stats import ListingQuery
from .training_loop import TrainingLoop, loop_refusal

MAX_SUB_JOBS = 8
MAX_LABELS = 16
MAX_IDLE_TIMEOUT_S = 7 * 24 * 3600
MAX_MEMORY_GIB = 4096
# Job ids a client may not choose: the other kinds of ids the backend hands out.
RESERVED_JOB_ID_PREFIXES = ("run-", "req-", "sub-", "tok_")

JobStatus = Literal[JOB_STATES]  # type: ignore[valid-type]
SubJobType = Literal[SUB_JOB_TYPES]  # type: ignore[valid-type]
ModuleName = Annotated[str, StringConstraints(pattern=MODULE_NAME)]


class LoraSpec(Body):
    r: int = Field(default=16, ge=1, le=1024, description="the adapter's rank")
    alpha: float = Field(default=32, ge=0, le=1e6, description="LoRA's scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0, le=0.99)
    target_modules: Literal["all-linear"] | Annotated[list[ModuleName], Field(min_length=1)] = Field(
        default="all-linear", description="'all-linear', or the names of the modules to adapt"
    )

    @field_validator("target_modules", mode="wrap")
    @classmethod
    def _one_message(cls, value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValueError:
            raise PydanticCustomError(
                "invalid_field", "must be 'all-linear' or a non-empty list of module names"
            ) from None


class OptimizerSpec(Body):
    """AdamW's settings (a training sub-job's; a step may override `lr` as `learning_rate`)."""

    lr: float = Field(default=1e-4, ge=0, le=10)
    betas: Annotated[list[Annotated[float, Field(ge=0, le=0.999999)]], Field(min_length=2, max_length=2)] = [
        0.9,
        0.999,
    ]
    eps: float = Field(default=1e-8, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    grad_clip: float | None = Field(
        default=None, ge=0, le=1e6, description="clip the gradient norm to this (none: no clipping)"
    )


# The most ranks one sub-job may ask for (one host's devices).
MAX_RANKS = 64


class SubJobSpec(Body):
    type: SubJobType
    base_model: str = Field(description="the name of a registered model (GET /v1/models)")
    lora: LoraSpec | None = None
    optimizer: OptimizerSpec | None = Field(
        default=None, description="only a training sub-job has an optimizer"
    )
    max_seq_len: int | None = Field(default=None, ge=1, description="at most the model's own maximum")
    seed: Seed = 0
    gradient_checkpointing: bool = Field(
        default=False,
        description="training only: keep each layer's input and recompute its activations in the backward"
        " pass (less memory, about a third more compute; the same gradients)",
    )
    n_gpus: int = Field(
        default=1,
        ge=1,
        le=MAX_RANKS,
        description="a training sub-job runs as this many ranks with FSDP2 (parameters, gradients and"
        " optimizer state sharded across them), one device each (CPU slots with gloo on a CPU backend); a"
        " sampling sub-job on vLLM devices runs one engine with this tensor-parallel size",
    )

    @model_validator(mode="after")
    def _optimizer_only_for_training(self) -> SubJobSpec:
        if self.optimizer is not None and self.type != TRAINING:
            raise PydanticCustomError("invalid_field", "optimizer: only a training sub-job has an optimizer")
        if self.gradient_checkpointing and self.type != TRAINING:
            raise PydanticCustomError(
                "invalid_field", "gradient_checkpointing: only a training sub-job runs a backward pass"
            )
        if self.n_gpus > 1 and self.type not in (TRAINING, SAMPLING):
            raise PydanticCustomError(
                "multi_gpu_sampling_unsupported",
                "n_gpus: a {kind} sub-job runs on one device (tensor parallelism serves sampling sub-jobs on"
                " vLLM). Use n_gpus: 1, or several {kind} sub-jobs",
                {"kind": self.type},
            )
        return self


class HardwareSpec(Body):
    min_memory_gib: float = Field(
        default=0, ge=0, le=MAX_MEMORY_GIB, description="each sub-job's device has at least this much memory"
    )


LabelKey = Annotated[str, StringConstraints(pattern=LABEL_KEY)]


class CreateJob(Body):
    """`POST /v1/jobs`."""

    body_name = "job"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"name": "sft", "sub_jobs": [{"type": "training", "base_model": "tiny", "lora": {"r": 8}}]}
            ]
        }
    )

    job_id: Identifier | None = None
    name: ShortText | None = None
    experiment: ShortText | None = None
    hardware: HardwareSpec | None = None
    sub_jobs: Annotated[list[SubJobSpec], Field(min_length=1, max_length=MAX_SUB_JOBS)]
    idle_timeout_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_IDLE_TIMEOUT_S,
        description="seconds a running job may do nothing before it is completed (0: never; default: the backend's)",
    )
    labels: Annotated[dict[LabelKey, ShortText], Field(max_length=MAX_LABELS)] | None = Field(
        default=None, description="free-form labels shown with the job; they never decide who may see it"
    )
    priority: int | None = Field(
        default=None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description=f"queue band, higher first (default {DEFAULT_PRIORITY}); above the default only as far"
        " as the token may (docs/api.md, Priorities)",
    )
    training_loop: TrainingLoop | None = Field(
        default=None,
        description="a training run: the JSON form of the `%%cortex train` spec"
        " (docs/api.md); only with exactly one training sub-job",
    )

    @field_validator("training_loop", mode="wrap")
    @classmethod
    def _loop_in_its_own_words(cls, value: Any, handler: Any) -> Any:
        # The ApiError is not a ValueError: it leaves validation as it is, naming `training_loop.<key>`.
        try:
            return handler(value)
        except ValidationError as exc:
            raise loop_refusal(exc) from None

    @field_validator("job_id")
    @classmethod
    def _not_reserved(cls, value: str | None) -> str | None:
        if value is not None and value.startswith(RESERVED_JOB_ID_PREFIXES):
            raise PydanticCustomError(
                "invalid_field",
                "may not start with {prefixes}: those name other kinds of ids",
                {"prefixes": ", ".join(RESERVED_JOB_ID_PREFIXES)},
            )
        return value

    @model_validator(mode="after")
    def _one_trainer(self) -> CreateJob:
        trainers = sum(1 for sub in self.sub_jobs if sub.type == TRAINING)
        if trainers > 1:
            raise PydanticCustomError(
                "too_many_training_sub_jobs",
                "a job has at most one training sub-job; this one has {count}. Create one job per trainer.",
                {"count": trainers},
            )
        return self


# --- what a job looks like --------------------------------------------------------------------------------


class LoraSettings(Reply):
    """A sub-job's LoRA settings as it was created with: a field left out has `LoraSpec`'s default."""

    r: int | None = None
    alpha: float | None = None
    dropout: float | None = None
    target_modules: Literal["all-linear"] | list[str] | None = None


class OptimizerSettings(Reply):
    """A training sub-job's AdamW settings as it was created with: a field left out has
    `OptimizerSpec`'s default."""

    lr: float | None = None
    betas: list[float] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None


class SubJobView(Reply):
    sub_job_id: str
    type: SubJobType
    status: JobStatus
    base_model: str
    lora: LoraSettings | None
    optimizer: OptimizerSettings | None
    seed: int | None
    max_seq_len: int | None
    device: str | None = Field(description="where it runs (`cpu:0`, `cuda:1`, ...) once placed")
    failure_code: str | None
    failure_message: str | None
    info: dict[str, Any] | None = Field(
        description="what its worker reported when it was ready (device, dtype, adapter...); a Tinker"
        " training client's `parking` (parked, parks, last_restore_s: docs/tinker.md)"
    )


class HistoryPoint(Reply):
    step: int | float = Field(description="whole while the curve is not decimated, a mean of steps after")
    loss_per_token: float | None


class EvalPoint(Reply):
    step: int | float
    eval_loss_per_token: float | None


class BudgetStop(Reply):
    """Where a run's device-seconds budget ran out: the step at which it was found spent, the job's
    device-seconds then, and at the step before (under the budget)."""

    step: int
    device_seconds: float
    before: float | None


class MismatchPoint(Reply):
    step: int | float
    sampler_mismatch_mean: float | None


class SampleItem(Reply):
    prompt: str
    text: str


class Samples(Reply):
    step: int
    items: list[SampleItem]


class ResumeNote(Reply):
    """How a training run came back after the backend stopped: from which checkpoint, at which step, and
    how many trained steps no checkpoint held (they are trained again; 0 after a drained stop)."""

    checkpoint_id: str | None = Field(description="null: no resumable checkpoint, trained again from step 0")
    step: int
    lost_steps: int
    restarts: int = Field(description="how many times this run was resumed")
    at: float
    reason: Literal["backend_restarted", "retry", "preempted"] = Field(
        default="backend_restarted",
        description="why it was resumed: a backend restart, its retry policy, or a preemption",
    )


class TrainingAttempt(Reply):
    """One attempt of a training run with a retry policy (the shape of a source run's attempts)."""

    attempt: int
    status: JobStatus
    failure_code: str | None
    failure_message: str | None
    retry_reason: str | None = Field(description="worker_crashed, host_lost or oom when the policy knows it")
    started_at: float | None
    finished_at: float
    step: int = Field(description="the last step the attempt trained")


class Preemption(Reply):
    """A training run paused at a resumable checkpoint to give its device to a higher-priority job
    (`--preempt-below`); it resumed from that checkpoint, losing no step."""

    at: float
    step: int = Field(description="the step it paused at (and resumed from)")
    checkpoint_id: str
    by_priority: int = Field(description="the band of the waiting job it made room for")


class Progress(Reply):
    """The job's progress record: the one place that computes the training numbers every view shows."""

    source: Literal[PROGRESS_MANAGED, PROGRESS_PRIMITIVE]  # type: ignore[valid-type]
    phase: Literal[PROGRESS_PHASES]  # type: ignore[valid-type]
    step: int
    total_steps: int | None
    loss_per_token: float | None = Field(
        description="the last step's summed loss / the sum of its loss weights"
    )
    summed_loss: float | None = Field(description="the last step's loss as the engine sums it")
    eval_loss_per_token: float | None
    eval_step: int | None
    tokens: int = Field(description="tokens trained on so far (attention-mask sum)")
    tokens_per_s: float | None
    steps_per_s: float | None
    started_at: float | None = Field(
        default=None,
        description="when training first started (unix seconds); a run resumed after a restart keeps it",
    )
    elapsed_s: float | None = Field(description="seconds since started_at (to the end, once finished)")
    eta_s: float | None
    last_checkpoint: str | None
    last_checkpoint_step: int | None = None
    weight_version: int | None
    history: list[HistoryPoint] = Field(description="at most 256 points, decimated on long runs")
    eval_history: list[EvalPoint]
    sampler_mismatch_mean: float | None = Field(
        default=None,
        description="RL losses: the last step's mean |sampler logprob - trainer logprob| over its sampled tokens",
    )
    sampler_mismatch_max: float | None = Field(default=None, description="the same gap's largest value")
    budget_device_s: float | None = Field(
        default=None, description="a training run's device-seconds budget (spent, it stops and saves 'final')"
    )
    budget_stop: BudgetStop | None = Field(default=None, description="set when the budget stopped the run")
    mismatch_history: list[MismatchPoint] = Field(
        default_factory=list, description="sampler_mismatch_mean per step, at most 256 points"
    )
    samples: Samples | None
    resumed: ResumeNote | None = None
    attempts: list[TrainingAttempt] = Field(
        default_factory=list, description="each attempt so far, with a retry policy in the spec"
    )
    preemptions: list[Preemption] = Field(
        default_factory=list, description="each time it made room for a higher-priority job"
    )
    updated_at: float


class QueueInfo(Reply):
    """Why a pending job waits, and where its priority puts it."""

    position: int
    reason: str
    blocked_by: list[str]
    estimate_s: float | None
    priority: int = Field(default=DEFAULT_PRIORITY, description="the band it asked for")
    effective_priority: int = Field(
        default=DEFAULT_PRIORITY, description="its band now, raised by waiting (aging)"
    )
    submitted_at: float | None = Field(default=None, description="ties in a band go oldest first")


class IdleInfo(Reply):
    """A running job with nothing to do: the backend frees its device at `frees_at`."""

    timeout_s: float | None
    frees_at: float


class JobView(Reply):
    """A job as every job route answers it, and each row of `GET /v1/jobs`."""

    job_id: str
    owner: str
    name: str | None
    experiment: str | None
    status: JobStatus
    failure_code: str | None
    failure_message: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    last_activity_at: float | None
    idle_timeout_s: float | None
    labels: dict[str, str]
    priority: int = Field(default=DEFAULT_PRIORITY, description="its queue band (0-9, higher first)")
    sub_jobs: list[SubJobView]
    training_loop: dict[str, Any] | None = Field(description="a training run's normalised spec")
    progress: Progress | None = Field(description="null while the job never trained")
    queue: QueueInfo | None = Field(description="non-null only while pending")
    idle: IdleInfo | None
    keep_alive_until: float | None
    device_seconds: float | None = Field(
        default=None,
        description="device-seconds so far: each sub-job holds one device slot from the job's start to its end",
    )


class CompletedJob(JobView):
    """`POST /v1/jobs/{job_id}/complete` ("Free device")."""

    saved_checkpoint: str | None = Field(
        description="the checkpoint trained steps no checkpoint held were saved as first (`final`), or null"
    )


class UpdateJob(Body):
    """`PATCH /v1/jobs/{job_id}`: rename a job, or replace its labels (tags)."""

    body_name = "job"
    name: ShortText | None = Field(default=None, description="the new name")
    labels: Annotated[dict[LabelKey, ShortText], Field(max_length=MAX_LABELS)] | None = Field(
        default=None, description="the job's labels, replaced whole ({} clears them)"
    )

    @model_validator(mode="after")
    def _something_to_change(self) -> UpdateJob:
        if self.name is None and self.labels is None:
            raise PydanticCustomError("invalid_request", "give name, labels or both")
        return self


class DeletedJob(Reply):
    """`DELETE /v1/jobs/{job_id}`: a finished job's record and its checkpoints are gone."""

    job_id: str
    deleted: bool
    checkpoints_deleted: list[str]
    freed_bytes: int


class JobPage(Reply):
    jobs: list[JobView]
    next_cursor: str | None


class ListJobsQuery(ListingQuery):
    status: JobStatus | None = None
    limit: int = Field(default=50, ge=1, description="at most 500 are returned")
    cursor: str | None = None


class GetJobQuery(Query):
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for a change: {WAIT_BOUND_TEXT}")
    while_status: JobStatus | None = Field(
        default=None, description="with `wait`: answer once the status differs"
    )
    after_progress: float | None = Field(
        default=None,
        description="with `wait`: answer once the progress record is newer than this `updated_at`",
    )
