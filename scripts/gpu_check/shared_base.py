"""A shared base: N training jobs as slots of one adapter host (`serve --adapter-host`), through the service.

For N = 1, 2, 4, 8 jobs (LoRA rank 16) on one base: the host's memory (device memory of the host's pid on a
GPU; on a CPU the PSS of the backend's process tree, which is the backend and the host), the bytes the host
itself reports (`GET /v1/capacity`: `executor.adapter_hosts[].base_bytes` and `slots_bytes`), and the
aggregate training tokens/s of the N slots stepping at once (a thread per job, each doing forward_backward
then step) over one slot alone; and, with every slot loaded, the aggregate sampling tokens/s of all slots
generating at once (a thread per job, greedy, up to `SAMPLE_TOKENS` tokens per row) over one slot alone, the host
batching the waiting slots' requests into shared passes (`--batch-across-slots all`: forward_backwards
too, so the training figures are of batched slots as well). "Slots that fit on this device" = (free memory with the base and one slot
loaded, plus that slot) / (bytes per slot), the bytes per slot being the larger of the host's growth per
slot measured here and the bytes a slot reports (adapter, gradients, two AdamW moments).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .checks import random_batch
from .hardware import device_used_bytes, free_bytes, process_memory

SLOT_COUNTS = (1, 2, 4, 8)
SAMPLE_TOKENS = 32
SAMPLE_ROUNDS = 3
LORA = {"r": 16, "alpha": 32}


def _train(jobs: list, batches: list[dict], rounds: int) -> float:
    """Seconds for every job to run `rounds` forward_backward + step, each job on a thread of its own."""

    def run(index: int) -> None:
        for _ in range(rounds):
            jobs[index].forward_backward(batches[index]).result()
            jobs[index].step().result()

    started = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(run, range(len(jobs))))
    return time.perf_counter() - started


def _sample(jobs: list, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate generated tokens/s of every job sending `SAMPLE_ROUNDS` greedy generates at once."""

    def run(index: int) -> int:
        return sum(
            jobs[index]
            .generate(prompts, max_tokens=tokens, temperature=0.0, ignore_eos=True)
            .result()
            .raw["generated_tokens"]
            for _ in range(SAMPLE_ROUNDS)
        )

    started = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        generated = sum(pool.map(run, range(len(jobs))))
    return generated / (time.perf_counter() - started)


def measure(
    data_dir: Path,
    model_dir: Path,
    devices: str,
    device: str,
    vocab: int,
    rows: int,
    length: int,
    rounds: int,
) -> dict[str, Any]:
    from .service import running_backend

    rng = np.random.default_rng(0)
    batches = [random_batch(rng, vocab, rows, length) for _ in range(max(SLOT_COUNTS))]
    used_before = device_used_bytes(device)
    options = [
        "--adapter-host",
        "--adapter-slots-per-device",
        str(max(SLOT_COUNTS)),
        "--batch-across-slots",
        "all",
    ]
    if device == "cpu":
        options += ["--worker-threads", "1"]
    by_count: dict[str, dict[str, Any]] = {}
    with running_backend(data_dir, {"check": model_dir}, devices, *options) as (client, backend_pid):
        jobs: list = []
        try:
            for count in SLOT_COUNTS:
                while len(jobs) < count:
                    jobs.append(
                        client.create_training_job(
                            "check", lora=LORA, optimizer={"lr": 1e-3}, seed=len(jobs), max_seq_len=length
                        )
                    )
                _train(jobs, batches, 1)  # every slot holds its gradients and optimizer moments
                (host,) = client.get_capacity()["executor"]["adapter_hosts"]
                if host["slots"] != count:
                    raise RuntimeError(f"{count} jobs but the adapter host has {host['slots']} slots: {host}")
                # On a CPU the backend's whole tree (the task's measure); on a GPU the host's device memory.
                memory = process_memory(backend_pid if device == "cpu" else host["pid"], device, used_before)
                free = free_bytes(device)
                seconds = _train(jobs, batches, rounds)
                by_count[str(count)] = {
                    "memory_bytes": memory["bytes"],
                    "memory_kind": memory["kind"],
                    "host_pid": host["pid"],
                    "base_bytes": host["base_bytes"],
                    "slots_bytes": host["slots_bytes"],
                    "slot_bytes": host["slots_bytes"] // count,
                    "free_bytes": free,
                    "tokens_per_s": count * rounds * rows * length / seconds,
                }
            # Within the jobs' max_seq_len (the training length): a quarter prompt, the rest sampled.
            prompts = [row[: max(1, length // 4)].tolist() for row in batches[0]["input_ids"]]
            tokens = min(SAMPLE_TOKENS, length - len(prompts[0]))
            _sample(jobs[:1], prompts, tokens)  # warm up
            sampling = {
                "1": _sample(jobs[:1], prompts, tokens),
                str(len(jobs)): _sample(jobs, prompts, tokens),
            }
            passes = sum(
                "slots sampled in one pass" in line["line"] for line in jobs[-1].logs(limit=5000)["lines"]
            )
        finally:
            for job in jobs:
                job.cancel()
    one, most = by_count["1"], by_count[str(max(SLOT_COUNTS))]
    for figures in by_count.values():
        figures["memory_ratio_vs_1"] = figures["memory_bytes"] / one["memory_bytes"]
        figures["tokens_per_s_ratio_vs_1"] = figures["tokens_per_s"] / one["tokens_per_s"]
    growth = (most["memory_bytes"] - one["memory_bytes"]) / (max(SLOT_COUNTS) - 1)
    per_slot = max(growth, one["slot_bytes"])
    free_after_base = one["free_bytes"] + per_slot
    return {
        "lora": LORA,
        "batch": [rows, length],
        "rounds": rounds,
        "slots": by_count,
        "measured_growth_per_slot_bytes": growth,
        "reported_slot_bytes": one["slot_bytes"],
        "free_after_base_bytes": free_after_base,
        "slots_per_device_estimate": int(free_after_base // per_slot) if per_slot > 0 else None,
        "sampling": {
            "tokens_per_row": tokens,
            "prompts": len(prompts),
            "tokens_per_s": sampling,
            "tokens_per_s_ratio_vs_1": sampling[str(len(jobs))] / sampling["1"],
            "passes_of_several_slots": passes,
        },
    }


def measure_vllm(
    data_dir: Path, model_dir: Path, devices: str, vocab: int, slots: int, prompts: int, tokens: int
) -> dict[str, Any]:
    """`slots` sampling jobs (rank 16) as vLLM slots of one adapter host (`--sampler vllm`): they share the
    host's one vLLM engine (engine/hosted_vllm.py). Aggregate greedy tokens/s of every slot generating at once
    over one slot alone, and what the host holds once (the engine's weights and KV cache among them)."""
    from .service import running_backend

    rows = np.random.default_rng(1).integers(0, vocab, size=(prompts, 8)).tolist()
    options = ["--adapter-host", "--adapter-slots-per-device", str(slots)]
    with running_backend(data_dir, {"check": model_dir}, devices, *options, sampler="vllm") as (client, _):
        samplers: list = []
        try:
            for index in range(slots):
                samplers.append(client.create_sampler("check", lora=LORA, seed=index))
            infos = [sub["info"] for sampler in samplers for sub in sampler.refresh()["sub_jobs"]]
            engines = [info["sampler"] for info in infos]
            if not all(engine["engine"] == "vllm" and engine.get("shared_engine") for engine in engines):
                raise RuntimeError(f"not every sampler is a slot of the shared vLLM engine: {engines}")
            if len({info["adapter_host"]["pid"] for info in infos}) != 1:
                raise RuntimeError("the samplers are not slots of one adapter host")
            _sample(samplers[:1], rows, tokens)  # warm up
            one = _sample(samplers[:1], rows, tokens)
            together = _sample(samplers, rows, tokens)
            (host,) = client.get_capacity()["executor"]["adapter_hosts"]
            shared_steps = sum(
                "together with other slots' requests" in line["line"]
                for line in samplers[-1].logs(limit=5000)["lines"]
            )
        finally:
            for sampler in samplers:
                sampler.cancel()
    return {
        "lora": LORA,
        "slots": slots,
        "prompts": prompts,
        "tokens_per_row": tokens,
        "host_bytes_once": host["base_bytes"],
        "slots_bytes": host["slots_bytes"],
        "engine_start_s": engines[0].get("start_s"),
        "tokens_per_s": {"1": one, str(slots): together},
        "tokens_per_s_ratio_vs_1": together / one,
        "requests_decoded_with_other_slots": shared_steps,
    }
