"""generate: batched sampling with a KV cache, seeded for reproducibility.

Prompts arrive as token ids (the service tokenizes text). Rows are left-padded so every row's next
token sits in the last column; positions come from the attention mask, as transformers does.
Per-token logprobs are under the model's own distribution (temperature 1, no truncation): what an
importance-sampling loss needs to compare against the trainer's logprobs. `prompt_logprobs` adds each
prompt's own per-token logprobs (scoring.prompt_logprobs).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from .errors import OperationError
from .model_state import ModelState

ROWS_PER_BATCH = 64


def _cache_keywords(model: torch.nn.Module) -> tuple[str, str | None]:
    """transformers renamed `past_key_values` to `cache` (and added `logits_to_keep`); speak both."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(base.forward).parameters
    cache = "cache" if "cache" in parameters else "past_key_values"
    keep = next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in parameters), None)
    return cache, keep


def _cache_of(output) -> object:
    return output.get("cache") if output.get("cache") is not None else output.get("past_key_values")


def _choose(logits: torch.Tensor, params: dict[str, Any], generator: torch.Generator | None) -> torch.Tensor:
    temperature = float(params.get("temperature", 1.0))
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scores = logits / temperature
    top_k = int(params.get("top_k") or 0)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    top_p = float(params.get("top_p", 1.0))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the best token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_scores, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _stop_position(text: str, stops: list[str], search_from: int) -> int | None:
    positions = [text.find(stop, max(0, search_from - len(stop))) for stop in stops]
    found = [position for position in positions if position >= 0]
    return min(found) if found else None


def _generate_rows(
    state: ModelState,
    rows: list[list[int]],
    params: dict[str, Any],
    generator: torch.Generator | None,
    should_cancel: Callable[[], bool],
) -> list[dict[str, Any]]:
    model, device = state.model, state.device
    tokenizer = state.tokenizer
    max_tokens = int(params.get("max_tokens", 16))
    stop_strings = [s for s in params.get("stop") or [] if isinstance(s, str)]
    stop_tokens = {int(s) for s in params.get("stop") or [] if isinstance(s, int)}
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer else state.model.config.eos_token_id
    if eos is not None and not params.get("ignore_eos"):
        stop_tokens.add(int(eos))
    pad = (getattr(tokenizer, "pad_token_id", None) if tokenizer else None) or 0
    want_logprobs = bool(params.get("logprobs", False))

    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        attention[i, width - len(row) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)

    generated: list[list[int]] = [[] for _ in rows]
    token_logprobs: list[list[float]] = [[] for _ in rows]
    finish: list[str | None] = [None] * len(rows)
    texts: list[str] = [""] * len(rows)
    cut_by_string = [False] * len(rows)
    cache_keyword, keep_keyword = _cache_keywords(model)
    keep = {keep_keyword: 1} if keep_keyword else {}
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, **keep)
    for _ in range(max_tokens):
        if should_cancel():
            raise OperationError("cancelled", "the request was cancelled")
        logits = out.logits[:, -1, :].float()
        chosen = _choose(logits, params, generator)
        chosen_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        chosen_list, logprob_list = chosen.tolist(), chosen_logprobs.tolist()
        for i, token in enumerate(chosen_list):
            if finish[i] is not None:
                continue
            generated[i].append(token)
            token_logprobs[i].append(logprob_list[i])
            if token in stop_tokens:
                finish[i] = "stop"
            elif stop_strings and tokenizer is not None:
                previous = len(texts[i])
                texts[i] = tokenizer.decode(generated[i])
                cut = _stop_position(texts[i], stop_strings, previous)
                if cut is not None:
                    texts[i] = texts[i][:cut]
                    finish[i] = "stop"
                    cut_by_string[i] = True
        if all(reason is not None for reason in finish):
            break
        attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=-1)
        positions = positions[:, -1:] + 1
        out = model(
            input_ids=chosen[:, None],
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{cache_keyword: _cache_of(out)},
            **keep,
        )
    results = []
    for i in range(len(rows)):
        tokens = generated[i]
        if finish[i] is None:
            finish[i] = "length"
        if tokenizer is not None and not cut_by_string[i]:
            ends_on_stop_token = finish[i] == "stop" and tokens[-1] in stop_tokens
            texts[i] = tokenizer.decode(tokens[:-1] if ends_on_stop_token else tokens)
        results.append(
            {
                "tokens": tokens,
                "text": texts[i] if tokenizer is not None else None,
                "logprob": float(sum(token_logprobs[i])),
                "logprobs": token_logprobs[i] if want_logprobs else None,
                "finish_reason": finish[i],
            }
        )
    return results


def generate(
    state: ModelState,
    prompts: list[list[int]],
    params: dict[str, Any],
    should_cancel: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    started = time.perf_counter()
    n = int(params.get("n", 1))
    seed = params.get("seed")
    if seed is None and float(params.get("temperature", 1.0)) > 0:
        seed = int.from_bytes(os.urandom(4), "little")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=state.device)
        generator.manual_seed(int(seed))
    rows = [(p, s, prompt) for p, prompt in enumerate(prompts) for s in range(n)]
    samples: list[dict[str, Any]] = []
    with state.inference():
        for start in range(0, len(rows), ROWS_PER_BATCH):
            batch = rows[start : start + ROWS_PER_BATCH]
            outputs = _generate_rows(state, [row[2] for row in batch], params, generator, should_cancel)
            for (prompt_index, sample_index, _), output in zip(batch, outputs, strict=True):
                samples.append({"prompt_index": prompt_index, "sample_index": sample_index, **output})
    scored = {}
    if params.get("prompt_logprobs"):
        from .scoring import prompt_logprobs

        scored["prompt_logprobs"] = prompt_logprobs(state, prompts)
    elapsed = time.perf_counter() - started
    new_tokens = sum(len(sample["tokens"]) for sample in samples)
    return {
        **scored,
        "samples": samples,
        "seed": seed,
        "weight_version": state.weight_version,
        "generated_tokens": new_tokens,
        "tokens_per_second": new_tokens / elapsed if elapsed > 0 else None,
    }
