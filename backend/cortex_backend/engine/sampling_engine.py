"""The sampling-engine interface: what a sub-job's `generate` runs on.

Two engines, chosen per backend (`--sampler`, see cortex_backend/samplers.py):
- `transformers` (engine/sampler.py): built in, batched with a KV cache; the only engine a training
  sub-job uses (its adapter changes every step);
- `vllm` (engine/vllm_sampler.py): the optional extra `cortex-nb[vllm]`, for sampling sub-jobs.

Both take token-id prompts and `SamplingParams` and return the same result shape: samples in prompt
order (`n` per prompt), the seed used, the weight version, the engine's name. The sub-job's
`ModelState` (the peft model) stays the source of truth for its weights: weight sync, checkpoint
loads and `forward` act on it, and an engine follows it (`refresh`) before it samples.
"""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Callable
from typing import Any

from cortex_nb.sampling_params import MAX_SEED, SamplingParams

from .model_state import ModelState

Cancelled = Callable[[], bool]


def resolve_seed(params: SamplingParams) -> int | None:
    """A sampled call without a seed gets a random one, reported in the result so it can be replayed."""
    if params.seed is None and not params.greedy:
        return int.from_bytes(os.urandom(8), "little") & MAX_SEED
    return params.seed


class SamplingEngine(abc.ABC):
    name: str = ""

    def __init__(self, state: ModelState) -> None:
        self.state = state

    def refresh(self) -> None:
        """Follow the sub-job's adapter if it changed (a weight sync or a checkpoint load)."""

    @abc.abstractmethod
    def sample(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None, should_cancel: Cancelled
    ) -> tuple[list[dict[str, Any]], list[list[float]] | None]:
        """The samples (prompt-major, `n` per prompt) and, if asked, each prompt's logprobs."""

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}

    def close(self) -> None:
        """Free what the engine holds beyond the sub-job's model."""

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | dict[str, Any],
        should_cancel: Cancelled = lambda: False,
    ) -> dict[str, Any]:
        if not isinstance(params, SamplingParams):
            params = SamplingParams.model_validate(params)
        started = time.perf_counter()
        self.refresh()
        seed = resolve_seed(params)
        samples, prompt_logprobs = self.sample(prompts, params, seed, should_cancel)
        elapsed = time.perf_counter() - started
        new_tokens = sum(len(sample["tokens"]) for sample in samples)
        result = {
            "samples": samples,
            "seed": seed,
            "weight_version": self.state.weight_version,
            "sampler": self.name,
            "generated_tokens": new_tokens,
            "tokens_per_second": new_tokens / elapsed if elapsed > 0 else None,
        }
        if params.prompt_logprobs:
            result["prompt_logprobs"] = prompt_logprobs
        return result


def open_engine(
    name: str, state: ModelState, sub_job_type: str, options: dict[str, Any] | None = None
) -> SamplingEngine:
    """The engine a sub-job samples with: `vllm` only for sampling sub-jobs, the built-in otherwise."""
    from .sampler import TransformersSampler

    if name == "vllm" and sub_job_type == "sampling":
        from .vllm_sampler import VllmSampler

        return VllmSampler(state, options or {})
    # A sampling sub-job only runs inference: its LoRA is merged into its own base weights.
    return TransformersSampler(state, merge_lora=sub_job_type == "sampling")
