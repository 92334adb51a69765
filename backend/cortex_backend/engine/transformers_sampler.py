"""The built-in `transformers` sampling engine: batched, with a KV cache, seeded for reproducibility.

Prompts arrive as token ids (the service tokenizes text). Each distinct prompt is prefilled once and
its KV cache repeated for its `n` samples. Rows are left-padded so every row's next token sits in the
last column; positions come from the attention mask, as transformers does. Tokens, logprobs and stop
flags stay on the device during decoding: the host looks at them only every few steps (every step on
a CPU, where looking costs nothing), and where stop strings need the text.

Per-token logprobs are under the model's own distribution (temperature 1, no truncation): what an
importance-sampling loss needs to compare against the trainer's logprobs.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from cortex_nb.protocol.schemas.sampling import SamplingParams

from .errors import OperationError
from .kv_cache import reserve, share_prefix
from .merged_lora import MergedLoRA
from .model_state import ModelState
from .prefix_attention import shared_prefix_attention, supports
from .prompt_scores import prompt_logprobs_of
from .sampling_interface import Cancelled, SamplingEngine
from .stopping import TextStop, finish_sample, stop_token_ids
from .token_stream import TokensCallback, TokenStreamer

# Rows (prompt x sample) decoded together: on a CPU a fixed number; on a GPU as many as a share of its free
# memory holds in KV cache (a larger batch is nearly free there), up to a cap.
ROWS_PER_BATCH = 64
GPU_KV_SHARE = 0.25
GPU_MAX_ROWS = 1024
# Decoding steps between looks at the stop flags on a GPU (each look waits for the device).
GPU_CHECK_EVERY = 8


def _runner(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model itself (peft injects LoRA into its layers; its wrapper only adds overhead)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _cache_keywords(model: torch.nn.Module) -> tuple[str, str | None]:
    """transformers renamed `past_key_values` to `cache` (and added `logits_to_keep`); speak both."""
    parameters = inspect.signature(model.forward).parameters
    cache = "cache" if "cache" in parameters else "past_key_values"
    keep = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)
    return cache, keep


def _cache_of(output) -> Any:
    return output.get("cache") if output.get("cache") is not None else output.get("past_key_values")


class RequestGenerators:
    """The random streams of several requests sampled in one call (sample_batching.py): each request's rows
    draw from its own seeded generator, so every request draws exactly the numbers it would draw alone."""

    def __init__(self, segments: list[tuple[torch.Generator | None, int]]) -> None:
        self.segments = segments  # (generator, rows) per request, in row order

    def uniform(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat(
            [
                torch.rand((rows, 1), generator=generator, device=device, dtype=dtype)
                for generator, rows in self.segments
            ]
        )


Generators = torch.Generator | RequestGenerators | None


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: Generators,
    logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token of each row: argmax at temperature 0, else a draw after temperature, top-k, top-p.
    `logprobs` (the log-softmax of `logits`, if the caller has it) spares a softmax when nothing reshapes
    the distribution."""
    if params.greedy:
        return logits.argmax(dim=-1)
    if logprobs is not None and params.temperature == 1.0 and params.top_k <= 0 and params.top_p >= 1.0:
        return draw(logprobs.exp(), generator)
    scores = logits / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the best token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_scores, dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return draw(torch.softmax(scores, dim=-1), generator)


def draw(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One token per row from `probs`, by inverting each row's cumulative distribution at a uniform draw.

    The same distribution as `torch.multinomial`, which draws an exponential variate for every token of
    the vocabulary at each step; this draws one number per row. A token of probability 0 is never chosen.
    """
    cumulative = probs.cumsum(dim=-1)
    total = cumulative[:, -1:].contiguous()
    if isinstance(generator, RequestGenerators):
        uniform = generator.uniform(probs.device, probs.dtype)
    else:
        uniform = torch.rand(total.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    chosen = torch.searchsorted(cumulative, uniform * total, right=True)
    # uniform * total can round up to total: the last token with any mass then.
    return torch.minimum(chosen, torch.searchsorted(cumulative, total)).squeeze(-1)


def shares_prefix(params: SamplingParams, device: torch.device) -> bool:
    """Whether a batch's samples read their prompt's cache in place (prefix_attention.py) rather than a copy
    per sample. Sampled rows only: greedy rows keep transformers' own attention, token for token what
    `generate` gives. A CPU only, where it was measured (bench/bench_sampling.py); a GPU keeps its fused
    attention kernels until measured there."""
    return params.n > 1 and not params.greedy and device.type == "cpu"


class _Decoder:
    """One batch of distinct prompts, `n` samples each, decoded together."""

    def __init__(self, state: ModelState, prompts: list[list[int]], params: SamplingParams) -> None:
        self.state, self.params, self.prompts = state, params, prompts
        self.model = _runner(state.model)
        self.device = state.device
        self.tokenizer = state.tokenizer
        self.stop_ids = stop_token_ids(params, self.tokenizer, state.model.config.eos_token_id)
        self.rows = len(prompts) * params.n
        self.check_every = 1 if self.device.type == "cpu" else GPU_CHECK_EVERY
        self.share_prefix = shares_prefix(params, self.device)
        strings = params.stop_strings
        self.text_stops = (
            [TextStop(strings, self.tokenizer) for _ in range(self.rows)]
            if strings and self.tokenizer is not None
            else None
        )
        self.host_tokens: list[list[int]] = [[] for _ in range(self.rows)]

    def run(
        self,
        generator: Generators,
        should_cancel: Cancelled,
        streamer: TokenStreamer | None = None,
    ) -> tuple[list[dict[str, Any]], list[list[float]]]:
        params, device, n = self.params, self.device, self.params.n
        pad = (getattr(self.tokenizer, "pad_token_id", None) if self.tokenizer else None) or 0
        width = max(len(prompt) for prompt in self.prompts)
        total = width + params.max_tokens
        input_ids = torch.full((len(self.prompts), width), pad, dtype=torch.long)
        prompt_mask = torch.zeros((len(self.prompts), width), dtype=torch.long)
        for i, prompt in enumerate(self.prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            prompt_mask[i, width - len(prompt) :] = 1
        input_ids, prompt_mask = input_ids.to(device), prompt_mask.to(device)
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        cache_keyword, keep_keyword = _cache_keywords(self.model)
        keep = {keep_keyword: 1} if keep_keyword else {}

        # Prefill each distinct prompt once, then repeat its cache for its n samples.
        prefill_keep = {} if params.prompt_logprobs else keep
        out = self.model(
            input_ids=input_ids,
            attention_mask=prompt_mask,
            position_ids=positions,
            use_cache=True,
            **prefill_keep,
        )
        prompt_logprobs = (
            prompt_logprobs_of(out.logits, input_ids, [len(p) for p in self.prompts])
            if params.prompt_logprobs
            else []
        )
        cache = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        next_positions = positions[:, -1:] + 1
        shared = self.share_prefix and supports(self.model) and share_prefix(cache, n, params.max_tokens)
        if n > 1:
            if not shared:
                cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            next_positions = next_positions.repeat_interleave(n, dim=0)
            prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        if not shared:
            reserve(cache, total)
        del out
        # The whole attention mask up front: generated positions are always attended (a finished row's
        # later tokens are discarded, and rows never see each other).
        # A 4D boolean mask (rows, 1, 1, positions) reaches attention as it is, sparing transformers
        # building one from the 2D mask at every step.
        mask = torch.ones((self.rows, 1, 1, total), dtype=torch.bool, device=device)
        mask[:, 0, 0, :width] = prompt_mask.bool()

        steps = params.max_tokens
        tokens = torch.empty((self.rows, steps), dtype=torch.long, device=device)
        logprobs = torch.empty((self.rows, steps), dtype=torch.float32, device=device)
        top_k = params.logprobs_topk
        top_values = torch.empty((self.rows, steps, top_k), dtype=torch.float32, device=device)
        top_ids = torch.empty((self.rows, steps, top_k), dtype=torch.long, device=device)
        kept = torch.full((self.rows,), steps, dtype=torch.long, device=device)
        done = torch.zeros(self.rows, dtype=torch.bool, device=device)
        stop_ids = (
            torch.tensor(sorted(self.stop_ids), dtype=torch.long, device=device) if self.stop_ids else None
        )
        taken = 0
        attention = shared_prefix_attention(self.model, cache) if shared else contextlib.nullcontext()
        with attention:
            for step in range(steps):
                if should_cancel():
                    raise OperationError("cancelled", "the request was cancelled")
                # Logprobs under the model's own distribution (temperature 1, untruncated), whatever the sampling.
                own = torch.log_softmax(logits, dim=-1)
                chosen = choose(logits, params, generator, own)
                tokens[:, step] = chosen
                logprobs[:, step] = own.gather(-1, chosen[:, None]).squeeze(-1)
                if top_k:
                    top_values[:, step], top_ids[:, step] = own.topk(top_k, dim=-1)
                if stop_ids is not None:
                    hit = torch.isin(chosen, stop_ids) & ~done
                    kept = torch.where(hit, step + 1, kept)
                    done |= hit
                taken = step + 1
                if taken == steps:
                    break
                if taken % self.check_every == 0:
                    if self.text_stops is not None:
                        done, kept = self._check_text(tokens, taken, done, kept)
                    if streamer is not None:
                        streamer.look(tokens, logprobs, taken, kept)
                    if bool(done.all()):
                        break
                out = self.model(
                    input_ids=chosen[:, None],
                    attention_mask=mask[..., : width + taken],
                    position_ids=next_positions,
                    use_cache=True,
                    **{cache_keyword: cache},
                    **keep,
                )
                cache = _cache_of(out)
                logits = out.logits[:, -1, :].float()
                next_positions = next_positions + 1
        if self.text_stops is not None:
            done, kept = self._check_text(tokens, taken, done, kept)
        if streamer is not None:
            streamer.look(tokens, logprobs, taken, kept, final=True)
        samples = self._samples(tokens[:, :taken], logprobs[:, :taken], kept.clamp(max=taken))
        if top_k:
            for sample, ids, values in zip(
                samples, top_ids[:, :taken].tolist(), top_values[:, :taken].tolist(), strict=True
            ):
                count = len(sample["tokens"])
                sample["topk_logprobs"] = {"token_ids": ids[:count], "logprobs": values[:count]}
        return samples, prompt_logprobs

    def _check_text(
        self, tokens: torch.Tensor, taken: int, done: torch.Tensor, kept: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Look for stop strings in the tokens drawn since the last look; end the rows that hold one."""
        seen = len(self.host_tokens[0])
        if taken > seen:
            for row, new in zip(self.host_tokens, tokens[:, seen:taken].tolist(), strict=True):
                row.extend(new)
        kept_now, done_now = kept.tolist(), done.tolist()
        ended: list[tuple[int, int]] = []
        for row, (text_stop, row_tokens) in enumerate(zip(self.text_stops, self.host_tokens, strict=True)):
            if text_stop.cut is not None:
                continue
            # A row that ended on a stop token is searched up to the token before it.
            limit = kept_now[row] - 1 if done_now[row] else len(row_tokens)
            end = text_stop.advance(row_tokens[:limit])
            if end is not None:
                ended.append((row, end))
        if ended:
            rows = torch.tensor([row for row, _ in ended], device=done.device)
            ends = torch.tensor([end for _, end in ended], device=done.device)
            done = done.clone()
            kept = kept.clone()
            done[rows] = True
            kept[rows] = ends
        return done, kept

    def _samples(
        self, tokens: torch.Tensor, logprobs: torch.Tensor, kept: torch.Tensor
    ) -> list[dict[str, Any]]:
        samples = []
        for row, (row_tokens, row_logprobs, count) in enumerate(
            zip(tokens.tolist(), logprobs.tolist(), kept.tolist(), strict=True)
        ):
            text_stop = self.text_stops[row] if self.text_stops is not None else None
            samples.append(
                finish_sample(
                    row_tokens[:count],
                    row_logprobs[:count],
                    self.stop_ids,
                    text_stop,
                    self.tokenizer,
                    self.params.logprobs,
                )
            )
        return samples


def rows_per_batch(state: ModelState, prompts: list[list[int]], params: SamplingParams) -> int:
    if state.device.type != "cuda":
        return ROWS_PER_BATCH
    config = state.model.config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return ROWS_PER_BATCH
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    length = max(len(prompt) for prompt in prompts) + params.max_tokens
    per_row = 2 * layers * kv_heads * head_dim * length * torch.finfo(state.dtype).bits // 8
    free, _ = torch.cuda.mem_get_info(state.device)
    return max(params.n, min(GPU_MAX_ROWS, int(free * GPU_KV_SHARE) // per_row))


class TransformersSampler(SamplingEngine):
    """The built-in engine. With `merge_lora` (sampling sub-jobs) the adapter is merged into this
    sub-job's own base weights and re-merged after every change; a trainer samples unmerged."""

    name = "transformers"
    streams_tokens = True
    batches_requests = True

    def __init__(self, state: ModelState, merge_lora: bool = False) -> None:
        super().__init__(state)
        self.merged = MergedLoRA(state.model) if merge_lora else None

    def refresh(self) -> None:
        if self.merged is not None:
            self.merged.ensure_current()

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "lora": "merged" if self.merged is not None else "unmerged"}

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seed: int | None,
        should_cancel: Cancelled,
        on_tokens: TokensCallback | None = None,
    ) -> tuple[list[dict[str, Any]], list[list[float]]]:
        generator = self._generator(seed)
        per_batch = max(1, rows_per_batch(self.state, prompts, params) // params.n)
        samples: list[dict[str, Any]] = []
        prompt_logprobs: list[list[float]] = []
        bare = self.merged.bare() if self.merged is not None else contextlib.nullcontext()
        with self.state.inference(), torch.inference_mode(), bare:
            for start in range(0, len(prompts), per_batch):
                batch = prompts[start : start + per_batch]
                decoder = _Decoder(self.state, batch, params)
                streamer = None
                if on_tokens is not None:
                    streamer = TokenStreamer(
                        on_tokens, decoder.rows, params.n, start, decoder.tokenizer, decoder.stop_ids
                    )
                outputs, batch_prompt_logprobs = decoder.run(generator, should_cancel, streamer)
                prompt_logprobs.extend(batch_prompt_logprobs)
                for row, output in enumerate(outputs):
                    prompt_index, sample_index = divmod(row, params.n)
                    samples.append(
                        {"prompt_index": start + prompt_index, "sample_index": sample_index, **output}
                    )
        return samples, prompt_logprobs

    def rows_in_one_pass(self, prompts: list[list[int]], params: SamplingParams) -> int:
        """How many rows (prompt x sample) one decoding pass takes; more are split into several passes."""
        return rows_per_batch(self.state, prompts, params)

    def sample_requests(
        self,
        prompt_lists: list[list[list[int]]],
        seeds: list[int | None],
        params: SamplingParams,
        should_cancel: Cancelled,
    ) -> list[list[dict[str, Any]]]:
        """Several requests' prompts in one decoding pass, each request drawing from its own seed; each
        request's samples numbered as its own. The caller keeps all rows within `rows_in_one_pass`."""
        prompts = [prompt for request_prompts in prompt_lists for prompt in request_prompts]
        generators = RequestGenerators(
            [
                (self._generator(seed), len(request_prompts) * params.n)
                for request_prompts, seed in zip(prompt_lists, seeds, strict=True)
            ]
        )
        bare = self.merged.bare() if self.merged is not None else contextlib.nullcontext()
        with self.state.inference(), torch.inference_mode(), bare:
            outputs, _ = _Decoder(self.state, prompts, params).run(generators, should_cancel)
        per_request: list[list[dict[str, Any]]] = []
        row = 0
        for request_prompts in prompt_lists:
            samples = []
            for prompt_index in range(len(request_prompts)):
                for sample_index in range(params.n):
                    samples.append(
                        {"prompt_index": prompt_index, "sample_index": sample_index, **outputs[row]}
                    )
                    row += 1
            per_request.append(samples)
        return per_request

    def _generator(self, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        generator = torch.Generator(device=self.state.device)
        generator.manual_seed(int(seed))
        return generator


def generate(
    state: ModelState,
    prompts: list[list[int]],
    params: SamplingParams | dict[str, Any],
    should_cancel: Cancelled = lambda: False,
) -> dict[str, Any]:
    """Sample with the built-in engine on the sub-job's model as it is (its adapter unmerged)."""
    return TransformersSampler(state).generate(prompts, params, should_cancel)
