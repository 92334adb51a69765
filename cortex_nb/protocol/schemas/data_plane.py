"""The data plane: the bodies of each operation, the 202 answer every submission gets, and a request as
it is polled (status, events, result) or listed.

forward_backward and forward take a tensor frame (docs/wire.md), not JSON; their losses and tensors are
`cortex_nb.protocol.losses`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from ..checkpoint_format import CHECKPOINT_TYPES, RESUMABLE
from ..states import REQUEST_STATES
from .base import IDENTIFIER, WAIT_BOUND_TEXT, Body, Cursor, Identifier, Query, Reply, WaitSeconds
from .sampling import SamplingParams

MAX_PROMPTS = 1024
WEIGHT_FORMATS = ("lora", "full")
OPERATIONS = (
    "forward_backward",
    "step",
    "generate",
    "forward",
    "noop",
    "save",
    "load",
    "weight_sync",
    "reset_prefix_cache",
)

RequestStatusName = Literal[REQUEST_STATES]  # type: ignore[valid-type]


def _checkpoint_id(value: Any) -> str:
    """Anything that is not a safe id (a path, a number, a trailing newline) is `invalid_checkpoint_id`."""
    if not isinstance(value, str) or not re.match(IDENTIFIER, value) or value.endswith("\n"):
        raise PydanticCustomError(
            "invalid_checkpoint_id",
            "{value} is not allowed: use 1-64 letters, digits, '_', '.' or '-', starting with a letter"
            " or digit (no slashes, no leading dot)",
            {"value": repr(value[:80] if isinstance(value, str) else value)},
        )
    return value


CheckpointId = Annotated[
    str, BeforeValidator(_checkpoint_id), WithJsonSchema({"type": "string", "pattern": IDENTIFIER})
]


class OperationQuery(Query):
    sub_job: str | None = Field(
        default=None, description="the sub-job to run on (default: the first that serves the operation)"
    )


class Submitted(Reply):
    """202: the request is queued; poll it by its id."""

    request_id: str
    job_id: str
    sub_job_id: str
    status: RequestStatusName


class NoopBody(Body):
    """A request that does nothing in the worker: measures the round trip."""


class ResetPrefixCacheBody(Body):
    """Drop the sampling engine's cached prompt prefixes (vLLM's prefix cache); queued after the sub-job's
    earlier requests, so they finish first."""


class RouterReplayDiscardBody(Body):
    """Free routes a sampler recorded for replay (`record_routes`): the named ones, or all of the job's."""

    routes_ids: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None,
        max_length=100_000,
        description="the samples' `routes_id`s; none or null: all of the job's",
    )


class RouterReplayDiscarded(Reply):
    """What a discard freed and what the job still holds."""

    discarded: int
    freed_bytes: int
    not_held: list[str] = Field(
        description="named ids the job does not hold (never recorded, or freed before)"
    )
    held_bytes: int
    cap_bytes: int


class StepBody(Body):
    """AdamW's settings for this step only; each one left out (or null) is the job's (`OptimizerSpec`)."""

    learning_rate: float | None = Field(
        default=None, ge=0, le=10, description="this step's learning rate (default: the job's)"
    )
    betas: (
        Annotated[list[Annotated[float, Field(ge=0, le=0.999999)]], Field(min_length=2, max_length=2)] | None
    ) = None
    eps: float | None = Field(default=None, ge=0, le=1)
    weight_decay: float | None = Field(default=None, ge=0, le=10)
    grad_clip: float | None = Field(
        default=None, ge=0, le=1e6, description="clip the gradient norm to this (0: no clipping)"
    )


class SavedAdapter(Body):
    """A checkpoint of yours whose adapter a generate or forward runs with instead of the live one."""

    checkpoint_id: CheckpointId
    job_id: Identifier | None = Field(default=None, description="the job that saved it (default: this job)")


def _adapter(value: Any) -> Any:
    """ "base" or a `SavedAdapter`; anything else is refused as the whole `adapter` field (not as a union member)."""
    if value == "base" or isinstance(value, SavedAdapter):
        return value
    if (
        isinstance(value, dict)
        and "checkpoint_id" in value
        and not set(value) - set(SavedAdapter.model_fields)
    ):
        try:
            return SavedAdapter.model_validate(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            if error["type"] == "invalid_checkpoint_id":
                raise PydanticCustomError("invalid_checkpoint_id", error["msg"]) from None
    raise PydanticCustomError(
        "invalid_field",
        'must be "base" or {"checkpoint_id", "job_id"?} naming a checkpoint (job_id defaults to this job)',
    )


AdapterChoice = Annotated[Literal["base"] | SavedAdapter, BeforeValidator(_adapter)]


class GenerateBody(Body):
    prompts: Annotated[
        list[str | Annotated[list[int], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)
    ] = Field(
        description="text prompts, or token-id lists (each fits the sub-job's max_seq_len with max_tokens)"
    )
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    adapter: AdapterChoice | None = Field(
        default=None,
        description='"base": the base model without an adapter; a saved checkpoint; default: the live adapter',
    )
    stream: bool = Field(
        default=False,
        description="answer with server-sent events (text/event-stream): `submitted`, `tokens` as they are"
        " decoded, then `result` (the request as polled once it ended)",
    )

    @model_validator(mode="after")
    def _targets_fit_prompts(self) -> GenerateBody:
        targets = self.sampling_params.prompt_logprobs_targets
        if targets is None:
            return self
        if len(targets) != len(self.prompts) or any(isinstance(prompt, str) for prompt in self.prompts):
            raise PydanticCustomError(
                "invalid_field",
                "sampling_params.prompt_logprobs_targets: one matrix per prompt, and the prompts as token ids",
            )
        for index, (prompt, matrix) in enumerate(zip(self.prompts, targets, strict=True)):
            if len(matrix) != len(prompt) - 1 or len({len(row) for row in matrix}) != 1:
                raise PydanticCustomError(
                    "invalid_field",
                    f"sampling_params.prompt_logprobs_targets[{index}]: must be {len(prompt) - 1} rows"
                    " (len(prompt) - 1) of one width",
                )
        return self


class SaveBody(Body):
    checkpoint_id: CheckpointId | None = Field(default=None, description="default: `step-N`")
    type: Literal[CHECKPOINT_TYPES] = RESUMABLE  # type: ignore[valid-type]
    ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        description="delete the checkpoint this many seconds after it is saved (the backend's bounds: 1 hour to"
        " 10 years by default); null: never",
    )


class LoadBody(Body):
    checkpoint_id: CheckpointId
    source_job_id: Identifier | None = Field(
        default=None, description="another job of yours (default: this job)"
    )
    target_sub_job_id: str | None = Field(
        default=None, description="default: the trainer, else the first sub-job"
    )
    restore_optimizer: bool = Field(
        default=True,
        description="a resumable checkpoint into a trainer also restores its optimizer, step and RNG state",
    )


class WeightSyncBody(Body):
    source: str | None = Field(default=None, description="the training sub-job (default: the job's trainer)")
    targets: list[str] | None = Field(
        default=None, description="distinct sampling sub-job ids (default: all of them)"
    )
    format: Literal[WEIGHT_FORMATS] = Field(  # type: ignore[valid-type]
        default="lora",
        description="lora: fp16 deltas where the target's weights are known; full: exact float32",
    )


class RequestEvent(Reply):
    seq: int
    at: float
    type: str = Field(description="queued, running, cancel_requested, succeeded, failed, cancelled")
    data: dict[str, Any]


class RequestError(Reply):
    code: str
    message: str | None


class RequestStatus(Reply):
    """A request as polled (`GET .../requests/{request_id}`) or cancelled."""

    request_id: str
    job_id: str
    sub_job_id: str
    op: str
    status: RequestStatusName
    created_at: float
    started_at: float | None
    finished_at: float | None
    result: dict[str, Any] | None = Field(
        description="the operation's result once it succeeded (docs/api.md)"
    )
    has_tensors: bool = Field(description="the result has tensors: GET .../tensors fetches them")
    error: RequestError | None
    events: list[RequestEvent] = Field(description="events after the `cursor` asked for")
    cursor: int = Field(description="the last event's seq: ask for events after it next time")


class RequestSummary(Reply):
    """A row of `GET /v1/jobs/{job_id}/requests`: a request without its result and events."""

    request_id: str
    job_id: str
    sub_job_id: str
    op: str
    status: RequestStatusName
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: RequestError | None


class RequestList(Reply):
    requests: list[RequestSummary]


class ListRequestsQuery(Query):
    limit: int = Field(default=100, ge=1, description="at most 1000 are returned")


class GetRequestQuery(Query):
    cursor: Cursor = Field(default=0, description="events after this seq")
    max_events: int = Field(default=100, ge=1, description="at most 1000")
    wait: WaitSeconds = Field(default=0.0, description=f"hold the answer for news: {WAIT_BOUND_TEXT}")


class ChunkStored(Reply):
    """A chunk of a large frame (or a run's source archive) is stored."""

    upload_id: str
    index: int
    status: Literal["stored", "consumed"]
