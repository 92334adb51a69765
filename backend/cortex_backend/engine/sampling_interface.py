"""The sampling-engine interface: what a sub-job's `generate` runs on (`sampling_engine.open_engine`
chooses and opens one).

Two engines, chosen per backend (`--sampler`, see cortex_backend/sampler_choice.py):
- `transformers` (engine/transformers_sampler.py): built in, batched with a KV cache; the only engine a training
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

from cortex_nb.protocol.schemas.base import MAX_SEED
from cortex_nb.protocol.schemas.sampling import SamplingParams

from .model_state import ModelState
from .token_stream import TokensCallback

Cancelled = Callable[[], bool]


def resolve_seed(params: SamplingParams) -> int | None:
    """A sampled call without a seed gets a random one, reported in the result so it can be replayed."""
    if params.seed is None and not params.greedy:
        return int.from_bytes(os.urandom(8), "little") & MAX_SEED
    return params.seed


class SamplingEngine(abc.ABC):
    name: str = ""
    # Whether `sample` takes `on_tokens` and calls it as tokens are decoded; an engine that does not is
    # streamed all at once, when its samples are done.
    streams_tokens: bool = False
    # Whether the engine samples several requests in one pass (`rows_in_one_pass`, `sample_requests`), each
    # as it would alone: sample_batching.py then runs queued compatible generates together.
    batches_requests: bool = False

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

    def rows_in_one_pass(self, prompts: list[list[int]], params: SamplingParams) -> int:
        """An engine that `batches_requests`: how many rows (prompt x sample) one pass decodes."""
        raise NotImplementedError(f"the {self.name} engine samples one request at a time")

    def sample_requests(
        self,
        prompt_lists: list[list[list[int]]],
        seeds: list[int | None],
        params: SamplingParams,
        should_cancel: Cancelled,
    ) -> list[list[dict[str, Any]]]:
        """An engine that `batches_requests`: several requests in one pass, each as it would sample alone."""
        raise NotImplementedError(f"the {self.name} engine samples one request at a time")

    def close(self) -> None:
        """Free what the engine holds beyond the sub-job's model."""

    def reset_prefix_cache(self) -> dict[str, Any]:
        """Drop cached prompt prefixes. The built-in engine shares a prompt's cache among its samples only
        within one generate call and keeps nothing between calls: there is nothing to drop, and it says so."""
        return {
            "engine": self.name,
            "reset": True,
            "cached_prefixes_dropped": 0,
            "detail": "the built-in engine keeps no prefix cache between generate calls; nothing was held",
        }

    def result_of(self, samples: list[dict[str, Any]], seed: int | None, elapsed: float) -> dict[str, Any]:
        """A generate's result: its samples, the seed to replay them, the weights that drew them."""
        new_tokens = sum(len(sample["tokens"]) for sample in samples)
        return {
            "samples": samples,
            "seed": seed,
            "weight_version": self.state.weight_version,
            "sampler": self.name,
            "generated_tokens": new_tokens,
            "tokens_per_second": new_tokens / elapsed if elapsed > 0 else None,
        }

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | dict[str, Any],
        should_cancel: Cancelled = lambda: False,
        on_tokens: TokensCallback | None = None,
    ) -> dict[str, Any]:
        """Sample `prompts`; with `on_tokens`, each look's newly decoded tokens are handed to it too."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.model_validate(params)
        started = time.perf_counter()
        self.refresh()
        seed = resolve_seed(params)
        if on_tokens is not None and self.streams_tokens:
            samples, prompt_logprobs = self.sample(prompts, params, seed, should_cancel, on_tokens)
        else:
            samples, prompt_logprobs = self.sample(prompts, params, seed, should_cancel)
            if on_tokens is not None:
                on_tokens([_whole(sample) for sample in samples])
        result = self.result_of(samples, seed, time.perf_counter() - started)
        if params.prompt_logprobs:
            result["prompt_logprobs"] = prompt_logprobs
        if params.prompt_logprobs_topk:
            # One more forward over the prompts with the request's weights (its adapter is applied around
            # generate), on either engine: on vLLM it comes from the sub-job's own model, as prompt logprobs do.
            from .prompt_scores import prompt_topk_logprobs

            result["prompt_topk_logprobs"] = prompt_topk_logprobs(
                self.state, prompts, params.prompt_logprobs_topk
            )
        if params.prompt_logprobs_targets is not None:
            from .prompt_scores import prompt_target_logprobs

            result["prompt_target_logprobs"] = prompt_target_logprobs(
                self.state, prompts, params.prompt_logprobs_targets
            )
        if params.prompt_alt_tokens_k:
            from .prompt_scores import prompt_alt_tokens

            result["prompt_alt_tokens"] = prompt_alt_tokens(
                self.state, prompts, params.prompt_alt_tokens_k, params.temperature, seed
            )
        return result


def _whole(sample: dict[str, Any]) -> dict[str, Any]:
    """A finished sample as one streamed piece (an engine that does not stream token by token)."""
    return {
        "prompt_index": sample["prompt_index"],
        "sample_index": sample["sample_index"],
        "tokens": sample["tokens"],
        "logprobs": sample.get("logprobs") or [],
        "text": sample.get("text") or "",
    }
