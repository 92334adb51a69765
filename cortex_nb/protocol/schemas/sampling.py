"""Sampling parameters: the one definition of what `generate` takes, with defaults and bounds.

The backend validates a request's `sampling_params` with `SamplingParams` (400 `invalid_field`, the
field named), the kernel SDK checks keyword names against `SAMPLING_KEYS`, and the sampler reads the
normalised object. Logprobs (`logprobs=True`, and `prompt_logprobs=True`) are under the model's own
distribution: temperature 1, no top-k/top-p truncation, the quantity an importance-sampling loss compares
against, whichever engine (`transformers` or `vllm`) sampled.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from .base import Body, Seed

MAX_SAMPLES_PER_PROMPT = 64
MAX_STOP_SEQUENCES = 16
MAX_NEW_TOKENS = 1 << 16
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 24
# The most top-k logprobs per position (vLLM's own default cap)
MAX_PROMPT_LOGPROBS_TOPK = 20

StopItem = Annotated[str, Field(min_length=1)] | Annotated[int, Field(ge=0)]


class SamplingParams(Body):
    """How to sample: `temperature` 0 is greedy; `top_k` 0 and `top_p` 1 turn truncation off; `stop` holds
    strings and/or token ids (one alone is taken as a list of one); `seed` makes a call reproducible."""

    max_tokens: int = Field(default=16, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(default=1.0, ge=0, le=MAX_TEMPERATURE)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, le=MAX_TOP_K)
    stop: Annotated[list[StopItem], Field(max_length=MAX_STOP_SEQUENCES)] = Field(default_factory=list)
    seed: Seed | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES_PER_PROMPT, description="samples per prompt")
    logprobs: bool = Field(default=False, description="each sampled token's log-probability")
    prompt_logprobs: bool = Field(
        default=False, description="per prompt, each prompt token's log-probability after the first"
    )
    logprobs_topk: int = Field(
        default=0,
        ge=0,
        le=MAX_PROMPT_LOGPROBS_TOPK,
        description="each sampled position's k most likely tokens and their log-probabilities (0: none; the"
        " built-in engine only)",
    )
    prompt_logprobs_topk: int = Field(
        default=0,
        ge=0,
        le=MAX_PROMPT_LOGPROBS_TOPK,
        description="per prompt, the k most likely tokens and their log-probabilities at each prompt position"
        " after the first (0: none)",
    )
    prompt_logprobs_targets: (
        Annotated[
            list[
                Annotated[
                    list[
                        Annotated[
                            list[Annotated[int, Field(ge=-1)]], Field(max_length=MAX_PROMPT_LOGPROBS_TOPK)
                        ]
                    ],
                    Field(min_length=1),
                ]
            ],
            Field(min_length=1),
        ]
        | None
    ) = Field(
        default=None,
        description="per token-id prompt, a [len(prompt) - 1][K] matrix of token ids (K at most 20): cell [i][j] is"
        " scored at prompt position i + 1; -1 asks nothing. The answer's `prompt_target_logprobs` has the same"
        " shape, 0.0 where -1 was",
    )
    prompt_alt_tokens_k: int = Field(
        default=0,
        ge=0,
        le=MAX_PROMPT_LOGPROBS_TOPK,
        description="per prompt, k tokens drawn (with replacement, at the request's temperature and seed) from the"
        " model's next-token distribution at each prompt position after the first, with their log-probabilities"
        " (temperature 1)",
    )
    ignore_eos: bool = Field(default=False, description="keep sampling past the end-of-sequence token")
    record_routes: bool = Field(
        default=False,
        description="on an MoE base (Mixtral, Qwen-MoE), keep the experts its routers chose for every token of each"
        " sample; each sample then carries a `routes_id` that a later forward_backward or forward names to"
        " replay them (docs/router-replay.md)",
    )

    @field_validator("stop", mode="wrap")
    @classmethod
    def _one_or_many(cls, value: Any, handler: Any) -> Any:
        if value is None:
            value = []
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]
        try:
            return handler(value)
        except ValueError:
            raise PydanticCustomError(
                "invalid_field",
                f"must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings or token ids",
            ) from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_strings(self) -> list[str]:
        return [item for item in self.stop if isinstance(item, str)]

    @property
    def stop_token_ids(self) -> list[int]:
        return [item for item in self.stop if isinstance(item, int)]


SAMPLING_KEYS: tuple[str, ...] = tuple(SamplingParams.model_fields)
