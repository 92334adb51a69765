"""Speed on the device, each figure with the definition it is computed by.

- LoRA training tokens/s and MFU: forward_backward + step on the trainer, timed after warm-up.
  Model FLOPs per token = 4 N (forward 2 N, the input-gradient backward 2 N; frozen weights get no
  weight gradient) + 12 L s d (attention scores and values, forward and backward), N = parameters in
  linear layers including the output head, L layers, s sequence length, d hidden width. So a LoRA step
  is about 4N FLOP per token without recompute (full fine-tuning's 6N less the weight gradients; gradient
  checkpointing would recompute the forward, another 2N, which is not counted: MFU counts model FLOPs).
- Batch-1 decode tokens/s against the HBM roofline: one prompt, greedy; the roofline is HBM bytes/s
  over the bytes a decoding step must read (every weight once, plus the KV cache so far).
- RL-shaped sampling throughput: prompts x samples x tokens at temperature 1, every sample running to
  max_tokens, for each engine and for transformers' `generate` on the same peft model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .hardware import synchronize


def timed(run: Callable[[], Any], device: str, repeats: int) -> tuple[float, Any]:
    """Median seconds of `repeats` runs after one warm-up, and the last run's value."""
    value = run()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        value = run()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), value


def training_throughput(
    trainer,
    batch: dict[str, np.ndarray],
    config: dict,
    linear_params: int,
    peak_flops: float | None,
    device: str,
    repeats: int,
) -> dict[str, Any]:
    def step() -> None:
        trainer.forward_backward(batch, "cross_entropy", {})
        trainer.step()

    seconds, _ = timed(step, device, repeats)
    rows, length = batch["input_ids"].shape
    tokens_per_s = rows * length / seconds
    flops_per_token = 4 * linear_params + 12 * config["num_hidden_layers"] * length * config["hidden_size"]
    achieved = tokens_per_s * flops_per_token
    return {
        "batch": [int(rows), int(length)],
        "tokens_per_s": tokens_per_s,
        "model_flops_per_token": flops_per_token,
        "achieved_tflops": achieved / 1e12,
        "mfu": achieved / peak_flops if peak_flops else None,
        "goal_mfu": 0.45,
    }


def decode_bytes_per_token(config: dict, total_params: int, context: int, element_bytes: int) -> int:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    kv = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * context * element_bytes
    return total_params * element_bytes + kv


def batch1_decode(
    engine,
    prompt: list[int],
    tokens: int,
    config: dict,
    total_params: int,
    element_bytes: int,
    hbm_bytes_per_s: float | None,
    device: str,
    repeats: int,
) -> dict[str, Any]:
    params = {"max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    seconds, _ = timed(lambda: engine.generate([prompt], params), device, repeats)
    tokens_per_s = tokens / seconds
    per_token = decode_bytes_per_token(config, total_params, len(prompt) + tokens // 2, element_bytes)
    roofline = hbm_bytes_per_s / per_token if hbm_bytes_per_s else None
    return {
        "engine": engine.name,
        "tokens_per_s": tokens_per_s,
        "roofline_tokens_per_s": roofline,
        "fraction_of_roofline": tokens_per_s / roofline if roofline else None,
        "goal_fraction": 0.6,
    }


def rl_sampling(engines: dict[str, Callable[[], int]], device: str, repeats: int) -> dict[str, Any]:
    """tokens/s of each engine on the same RL-shaped call; ratios against transformers' generate."""
    rows = {}
    for name, run in engines.items():
        seconds, tokens = timed(run, device, repeats)
        rows[name] = {"tokens": int(tokens), "seconds": seconds, "tokens_per_s": tokens / seconds}
    base = rows.get("transformers generate")
    for row in rows.values():
        row["ratio_vs_generate"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    return rows


def hf_generate(model, prompts: list[list[int]], samples: int, tokens: int, device: str) -> Callable[[], int]:
    """transformers' own batched sampling on the peft model, as the baseline."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def run() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                num_return_sequences=samples,
                pad_token_id=0,
            )
        return (out.shape[1] - width) * out.shape[0]

    return run
