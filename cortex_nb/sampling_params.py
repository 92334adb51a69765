"""Sampling parameters: the one definition of what `generate` accepts, with its defaults and bounds.

The backend validates requests with `SamplingParams.from_json` (400 `invalid_field`, the field named),
the kernel SDK checks keyword names against `SAMPLING_KEYS`, and both sampling engines (`transformers`,
`vllm`) read the normalised object. Torch-free.

Logprobs, for both engines: `logprobs` (per sampled token) and `prompt_logprobs` (per prompt token
after the first) are under the model's own distribution: temperature 1, no top-k/top-p truncation,
the quantity the trainer's `forward` computes for the same tokens. That is what an importance-sampling
loss compares against, whatever temperature or truncation the tokens were drawn with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import ApiError

MAX_SAMPLES_PER_PROMPT = 64
MAX_STOP_SEQUENCES = 16
MAX_NEW_TOKENS = 1 << 16
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1
MAX_TOP_K = 1 << 24


def _field_error(name: str, message: str) -> ApiError:
    field = f"sampling_params.{name}"
    return ApiError("invalid_field", f"{field}: {message}", {"field": field})


def _number(value: Any, name: str, low: float, high: float | None = None, integer: bool = False) -> Any:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (integer and not isinstance(value, int))
    ):
        raise _field_error(name, f"must be {'an integer' if integer else 'a number'}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _field_error(name, f"must be a finite number, got {value!r}")
    if value < low:
        raise _field_error(name, f"must be at least {low}, got {value}")
    if high is not None and value > high:
        raise _field_error(name, f"must be at most {high}, got {value}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `temperature` 0 is greedy; `top_k` 0 and `top_p` 1 turn truncation off;
    `stop` holds strings and/or token ids; `seed` makes a call reproducible on the same engine."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str | int, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    prompt_logprobs: bool = False
    ignore_eos: bool = False

    @classmethod
    def from_json(cls, value: Any) -> SamplingParams:
        """Validate a request's `sampling_params` object (None: all defaults)."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ApiError(
                "invalid_field",
                f"sampling_params: must be an object, got {type(value).__name__}",
                {"field": "sampling_params"},
            )
        unknown = sorted(set(value) - set(SAMPLING_KEYS))
        if unknown:
            raise _field_error(unknown[0], f"unknown field; allowed: {sorted(SAMPLING_KEYS)}")
        given = value
        defaults = cls()
        max_tokens = _number(
            given.get("max_tokens", defaults.max_tokens), "max_tokens", 1, MAX_NEW_TOKENS, integer=True
        )
        temperature = _number(
            given.get("temperature", defaults.temperature), "temperature", 0, MAX_TEMPERATURE
        )
        top_p = _number(given.get("top_p", defaults.top_p), "top_p", 0, 1)
        if top_p == 0:
            raise _field_error("top_p", "must be greater than 0")
        top_k = _number(given.get("top_k", defaults.top_k), "top_k", 0, MAX_TOP_K, integer=True)
        n = _number(given.get("n", defaults.n), "n", 1, MAX_SAMPLES_PER_PROMPT, integer=True)
        seed = given.get("seed")
        if seed is not None:
            _number(seed, "seed", 0, MAX_SEED, integer=True)
        stop = given.get("stop")
        if stop is None:
            stop = ()
        if isinstance(stop, (str, int)) and not isinstance(stop, bool):
            stop = [stop]
        if (
            not isinstance(stop, (list, tuple))
            or len(stop) > MAX_STOP_SEQUENCES
            or not all(
                (isinstance(s, str) and s) or (isinstance(s, int) and not isinstance(s, bool) and s >= 0)
                for s in stop
            )
        ):
            raise _field_error(
                "stop", f"must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings or token ids"
            )
        flags = {}
        for flag in ("logprobs", "prompt_logprobs", "ignore_eos"):
            flags[flag] = given.get(flag, False)
            if not isinstance(flags[flag], bool):
                raise _field_error(flag, "must be true or false")
        return cls(
            max_tokens=max_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=top_k,
            stop=tuple(stop),
            seed=seed,
            n=n,
            **flags,
        )

    def to_json(self) -> dict[str, Any]:
        """The normalised form, every field present (what a request records and a worker receives)."""
        out = asdict(self)
        out["stop"] = list(self.stop)
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_strings(self) -> list[str]:
        return [s for s in self.stop if isinstance(s, str)]

    @property
    def stop_token_ids(self) -> list[int]:
        return [s for s in self.stop if isinstance(s, int)]


SAMPLING_KEYS: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams))
