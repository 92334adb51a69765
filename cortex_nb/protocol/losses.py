"""The losses forward_backward accepts, as data: the tensors each needs (with dtypes and shapes) and the
config keys it takes (with defaults and ranges).

One `LossSpec` per loss. The client casts a batch with it, the backend validates the frame and fills in
the config's defaults with it, and the engine's registry (`cortex_backend/engine/losses.py`) holds one
function per spec, checked at import. Losses sum over tokens (never average): scale with `weights` or
`advantages`, so accumulating several batches before `step` is a plain sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Every tensor of a batch is a [batch, length] matrix, like input_ids ...
BATCH_SHAPE = ("batch", "length")
# ... except where a loss takes several targets per position (top-k distillation): then its `multi_target`
# tensors are [batch, length, K] arrays, all of one shape; position t, column k scores target_tokens[b, t, k].
MULTI_TARGET_SHAPE = ("batch", "length", "targets")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # what the client casts to and what travels in the frame: "int64" or "float32"
    meaning: str
    shape: tuple[str, ...] = BATCH_SHAPE

    @property
    def integer(self) -> bool:
        return self.dtype.startswith("int")


@dataclass(frozen=True)
class ConfigKey:
    name: str
    default: float
    low: float
    high: float
    meaning: str


@dataclass(frozen=True)
class LossSpec:
    name: str
    formula: str
    tensors: tuple[str, ...]  # needed besides input_ids (and the optional attention_mask), named in TENSORS
    config: tuple[ConfigKey, ...] = ()
    metrics: tuple[str, ...] = ("loss:sum",)  # named with their reduction
    # Tensors that may travel as [batch, length, K] (MULTI_TARGET_SHAPE), all of one shape, target_tokens among
    # them; a loss without any takes one target per position.
    multi_target: tuple[str, ...] = ()
    # Tensors that always travel as [batch, length, K] (a custom loss's rank-2 inputs), each with its own K.
    wide: tuple[str, ...] = ()

    @property
    def config_keys(self) -> dict[str, ConfigKey]:
        return {key.name: key for key in self.config}

    def defaults(self) -> dict[str, float]:
        return {key.name: key.default for key in self.config}

    def config_problem(self, config: dict[str, Any]) -> tuple[str, str] | None:
        """(key, what is wrong) for the first bad entry of a `loss_fn_config`, or None when it is fine."""
        allowed = self.config_keys
        for name, value in config.items():
            key = allowed.get(name)
            if key is None:
                return name, f"unknown field; {self.name} takes {sorted(allowed) or 'no config'}"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return name, f"must be a finite number, got {value!r}"
            if not key.low <= value <= key.high:
                return name, f"must be in [{key.low}, {key.high}], got {value}"
        return None

    def with_defaults(self, config: dict[str, Any]) -> dict[str, float]:
        """The full config the engine computes with: every key, defaults where the client sent none."""
        return {**self.defaults(), **{name: float(value) for name, value in config.items()}}


TENSORS: dict[str, TensorSpec] = {
    spec.name: spec
    for spec in (
        TensorSpec("input_ids", "int64", "the tokens fed to the model"),
        TensorSpec(
            "attention_mask", "int64", "1 for real tokens, 0 for padding (optional; all ones when absent)"
        ),
        TensorSpec("target_tokens", "int64", "the token whose log-probability each position scores"),
        TensorSpec(
            "weights",
            "float32",
            "each position's weight in the summed loss (0 leaves it out; may be negative)",
        ),
        TensorSpec("logprobs", "float32", "each target's log-probability under the policy that sampled it"),
        TensorSpec("advantages", "float32", "each position's advantage"),
        TensorSpec(
            "sequence_ratio_mask",
            "float32",
            "non-zero at the positions whose log-ratios average into their sequence's importance ratio (GSPO)",
        ),
    )
}

# The importance ratio's clip, as PPO and CISPO take it.
RATIO_CLIP = (
    ConfigKey("clip_low_threshold", 0.8, 0.0, 1.0, "the ratio's lower clip"),
    ConfigKey("clip_high_threshold", 1.2, 1.0, 100.0, "the ratio's upper clip"),
)

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec(
            "cross_entropy",
            "loss = sum(weights * -logprob(target)), over every position and, with [batch, length, K] targets,"
            " every target of a position",
            ("target_tokens", "weights"),
            metrics=("loss:sum", "weights:sum"),
            multi_target=("target_tokens", "weights"),
        ),
        LossSpec(
            "importance_sampling",
            "loss = -sum(exp(logprob - sampling_logprob) * advantage)",
            ("target_tokens", "logprobs", "advantages"),
            metrics=("loss:sum", "ratio:mean"),
        ),
        LossSpec(
            "ppo",
            "loss = -sum(min(ratio * adv, clip(ratio, low, high) * adv)), ratio = exp(logprob - sampling_logprob)",
            ("target_tokens", "logprobs", "advantages"),
            config=RATIO_CLIP,
            metrics=("loss:sum", "ratio:mean", "clip_fraction:mean"),
        ),
        LossSpec(
            "cispo",
            "loss = -sum(stop_gradient(clip(ratio, low, high)) * logprob * adv), ratio = exp(logprob - sampling_logprob)",
            ("target_tokens", "logprobs", "advantages"),
            config=RATIO_CLIP,
            metrics=("loss:sum", "ratio:mean", "clip_fraction:mean"),
        ),
        LossSpec(
            "gspo",
            "loss = -sum(min(s * adv, clip(s, low, high) * adv)), s = stop_gradient(exp(mean of"
            " logprob - sampling_logprob over the sequence's masked positions)) * exp(logprob - stop_gradient(logprob))",
            ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
            config=RATIO_CLIP,
            metrics=("loss:sum", "ratio:mean", "clip_fraction:mean"),
        ),
        LossSpec(
            "dro",
            "loss = -sum(logprob * adv - beta / 2 * (logprob - sampling_logprob)^2)",
            ("target_tokens", "logprobs", "advantages"),
            config=(
                ConfigKey("beta", 0.05, 0.0, 1000.0, "the weight of the quadratic penalty on the log-ratio"),
            ),
            metrics=("loss:sum",),
        ),
    )
}
LOSS_FUNCTIONS = tuple(LOSSES)
# loss -> the tensors it needs besides input_ids (a view of LOSSES, for code that predates LossSpec)
LOSS_INPUTS: dict[str, tuple[str, ...]] = {name: spec.tensors for name, spec in LOSSES.items()}
DEFAULT_LOSS = "cross_entropy"


def wire_dtype(tensor_name: str) -> str:
    """The dtype a batch tensor travels as: its spec's, float32 for a tensor no spec names."""
    spec = TENSORS.get(tensor_name)
    return spec.dtype if spec is not None else "float32"
