"""A quantized base (QLoRA): the same model registered twice on one backend, once `--quantize NAME=nf4`
(bitsandbytes NF4 on CUDA, torchao's NF4Tensor on a CPU), trained the same way, one job after the other.

Figures, quantized over full precision: the worker process's memory (device memory of its pid on a GPU, its
PSS on a CPU, where torchao quantizes a base first loaded in full, so it does not fall there), the base's
bytes as the worker reports them (`info.base_bytes`: packed bytes for a quantized tensor), and LoRA
training tokens/s. A check: the quantized job's loss falls over its steps on one repeated batch. An
8B-class figure is not measured (no download): it is extrapolated as 8e9 parameters times the NF4 base
bytes per parameter measured here (the embeddings and head stay unquantized, so a small model's figure
per parameter is the larger one).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .checks import random_batch
from .hardware import device_used_bytes, process_memory, wait_for_exit

LORA = {"r": 16, "alpha": 32}
EIGHT_B_PARAMETERS = 8e9


def _train(client, model: str, device: str, batch: dict, steps: int) -> dict[str, Any]:
    """One job on `model`: `steps` forward_backward + step on the same batch, timed after the first."""
    used_before = device_used_bytes(device)
    job = client.create_training_job(model, lora=LORA, optimizer={"lr": 1e-2}, seed=1)
    try:
        losses, seconds = [], []
        for _ in range(steps):
            started = time.perf_counter()
            losses.append(job.forward_backward(batch).result()["loss"])
            job.step().result()
            seconds.append(time.perf_counter() - started)
        info = job.refresh()["sub_jobs"][0]["info"]
        memory = process_memory(info["pid"], device, used_before)
    finally:
        job.cancel()
    wait_for_exit(info["pid"])  # its memory is back before the next job is measured
    rows, length = batch["input_ids"].shape
    return {
        "quantization": info.get("quantization"),
        "losses": losses,
        "worker_memory_bytes": memory["bytes"],
        "memory_kind": memory["kind"],
        "base_bytes": info["base_bytes"],
        "tokens_per_s": rows * length / float(np.median(seconds[1:] or seconds)),
    }


def measure(
    data_dir: Path,
    model_dir: Path,
    devices: str,
    device: str,
    vocab: int,
    parameters: int,
    rows: int,
    length: int,
    steps: int,
) -> dict[str, Any]:
    from .service import running_backend

    batch = random_batch(np.random.default_rng(0), vocab, rows, length)
    models = {"check": model_dir, "check-nf4": model_dir}
    options = ["--quantize", "check-nf4=nf4"] + (["--worker-threads", "1"] if device == "cpu" else [])
    with running_backend(data_dir, models, devices, *options) as (client, _):
        full = _train(client, "check", device, batch, steps)
        nf4 = _train(client, "check-nf4", device, batch, steps)
    if nf4["quantization"] != "nf4":
        raise RuntimeError(f"the quantized job's base is held as {nf4['quantization']!r}, not nf4")
    per_parameter = nf4["base_bytes"] / parameters
    losses = nf4["losses"]
    return {
        "batch": [rows, length],
        "steps": steps,
        "full_precision": full,
        "nf4": nf4,
        "worker_memory_ratio": nf4["worker_memory_bytes"] / full["worker_memory_bytes"],
        "base_bytes_ratio": nf4["base_bytes"] / full["base_bytes"],
        "tokens_per_s_ratio": nf4["tokens_per_s"] / full["tokens_per_s"],
        "nf4_base_bytes_per_parameter": per_parameter,
        "base_8b_nf4_bytes_extrapolated": EIGHT_B_PARAMETERS * per_parameter,
        "checks": {
            "loss_falls": {"passed": losses[-1] < losses[0], "first": losses[0], "last": losses[-1]},
        },
    }
