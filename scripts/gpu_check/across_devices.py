"""Sub-jobs across devices, through the service.

- Training (`n_gpus: N`, FSDP2, one rank per device; every GPU of the host, or two CPU slots in the dry run)
  against the same job on one device, stepped in turn on the same batches: the step time ratio, each rank's
  peak memory (the forward_backward result's `ranks`) against the one-device job's, and a check that the
  losses agree within 1e-4.
- Sampling (`n_gpus: 2` on a `--sampler vllm` backend: one tensor-parallel vLLM engine over two devices)
  against a one-device vLLM sampler: a check that greedy tokens are equal, and the tokens/s ratio.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from .checks import random_batch

LORA = {"r": 16, "alpha": 32}
LOSS_ATOL = 1e-4


def _step(job, batch: dict) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    result = job.forward_backward(batch).result()
    job.step().result()
    return time.perf_counter() - started, result


def training(
    data_dir: Path, model_dir: Path, devices: str, device: str, ranks: int, vocab: int, rows: int, length: int
) -> dict[str, Any]:
    from .service import running_backend

    rng = np.random.default_rng(0)
    batches = [random_batch(rng, vocab, rows, length) for _ in range(3)]
    spec = {"lora": LORA, "optimizer": {"lr": 1e-3}, "seed": 1}
    options = ["--worker-threads", "1"] if device == "cpu" else []
    with running_backend(data_dir, {"check": model_dir}, devices, *options) as (client, _):
        single = client.create_training_job("check", **spec)
        ranked = client.create_training_job("check", n_gpus=ranks, **spec)
        try:
            sharding = ranked.info["sub_jobs"][0]["info"].get("sharding")
            steps = []
            for batch in batches:  # in turn, so neither times the other's work
                one_seconds, one = _step(single, batch)
                many_seconds, many = _step(ranked, batch)
                steps.append((one_seconds, one, many_seconds, many))
        finally:
            single.cancel()
            ranked.cancel()
    timed = steps[1:]  # the first step warms up
    one_seconds = statistics.median(step[0] for step in timed)
    many_seconds = statistics.median(step[2] for step in timed)
    differences = [abs(step[1]["loss"] - step[3]["loss"]) for step in steps]
    single_peak = max(int(step[1]["peak_memory_bytes"]) for step in steps)
    rank_peaks = [
        max(
            int(rank["peak_memory_bytes"]) for step in steps for rank in step[3]["ranks"] if rank["rank"] == r
        )
        for r in range(ranks)
    ]
    return {
        "n_gpus": ranks,
        "sharding": sharding,
        "batch": [rows, length],
        "losses_one_device": [step[1]["loss"] for step in steps],
        "losses_across_devices": [step[3]["loss"] for step in steps],
        "step_seconds_one_device": one_seconds,
        "step_seconds_across_devices": many_seconds,
        "step_time_ratio": many_seconds / one_seconds,
        "peak_memory_kind": steps[-1][3]["ranks"][0]["peak_memory_kind"],
        "single_peak_memory_bytes": single_peak,
        "rank_peak_memory_bytes": rank_peaks,
        "rank_memory_ratio": max(rank_peaks) / single_peak,
        "checks": {
            "losses_equal": {
                "passed": max(differences) <= LOSS_ATOL,
                "max_abs_difference": max(differences),
                "tolerance": LOSS_ATOL,
            }
        },
    }


def _timed_generate(sampler, prompts: list[list[int]], tokens: int, repeats: int) -> tuple[float, list]:
    params = {"max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    sampler.generate(prompts, **params).result()  # warm-up
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = sampler.generate(prompts, **params).result()
        seconds.append(time.perf_counter() - started)
    return len(prompts) * tokens / statistics.median(seconds), [s["tokens"] for s in result.samples]


def tensor_parallel_sampling(
    data_dir: Path,
    model_dir: Path,
    devices: str,
    device: str,
    vocab: int,
    prompts: int,
    tokens: int,
    repeats: int,
) -> dict[str, Any]:
    from cortex_nb.training import Sampler

    from .service import running_backend

    rng = np.random.default_rng(0)
    prompt_ids = [rng.integers(3, vocab, size=16).tolist() for _ in range(prompts)]
    options = ["--worker-threads", "1"] if device == "cpu" else []
    figures = {}
    with running_backend(data_dir, {"check": model_dir}, devices, *options, sampler="vllm") as (client, _):
        for n_gpus in (1, 2):  # one after the other: each engine has the devices to itself
            sampler = Sampler.create(client, "check", lora=LORA, seed=2, n_gpus=n_gpus)
            try:
                info = sampler.refresh()["sub_jobs"][0]["info"]["sampler"]
                tokens_per_s, greedy = _timed_generate(sampler, prompt_ids, tokens, repeats)
            finally:
                sampler.cancel()
            figures[n_gpus] = {
                "engine": info.get("engine"),
                "tensor_parallel_size": info.get("tensor_parallel_size"),
                "tokens_per_s": tokens_per_s,
                "greedy": greedy,
            }
    one, two = figures[1], figures[2]
    exact = sum(a == b for a, b in zip(one["greedy"], two["greedy"], strict=True))
    return {
        "shape": f"{prompts}x{tokens}",
        "engine": two["engine"],
        "tensor_parallel_size": two["tensor_parallel_size"],
        "tokens_per_s_one_device": one["tokens_per_s"],
        "tokens_per_s_two_devices": two["tokens_per_s"],
        "tokens_per_s_ratio": two["tokens_per_s"] / one["tokens_per_s"],
        "checks": {"greedy_equal": {"passed": exact == prompts, "exact": exact, "prompts": prompts}},
    }
