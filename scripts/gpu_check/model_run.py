"""Every check and measure of one model shape, in a process of its own (a vLLM engine and the model's
memory go when it exits). Writes its record as JSON to the path it is given.

    python -m gpu_check.model_run SHAPE MODEL_DIR OUT.json [--dry-run] [--peak-tflops X] [--hbm-tbps Y]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import checks, measures
from .hardware import device_summary, peaks_for
from .shapes import SHAPES, parameter_counts


@dataclass(frozen=True)
class Sizes:
    parity_batches: int
    parity_rows: int
    parity_length: int
    sync_prompts: int
    sync_tokens: int
    train_rows: int
    train_length: int
    decode_prompt: int
    decode_tokens: int
    rl_prompts: int
    rl_samples: int
    rl_prompt_length: int
    rl_tokens: int
    repeats: int


GPU_SIZES = Sizes(3, 4, 512, 16, 64, 8, 1024, 32, 256, 64, 8, 128, 256, 3)
DRY_RUN_SIZES = Sizes(2, 2, 16, 3, 8, 2, 32, 8, 8, 4, 2, 8, 8, 1)
LORA = {"r": 16, "alpha": 32, "dropout": 0.0}


def attempt(record: dict[str, Any], key: str, run) -> Any:
    """Run one stage; a failure is recorded with its reason and the remaining stages still run."""
    try:
        record[key] = run()
        return record[key]
    except Exception as exc:  # a GPU check reports everything it could not do, then goes on
        record[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        return None


def run(
    shape_name: str, model_dir: Path, dry_run: bool, peak_tflops: float | None, hbm_tbps: float | None
) -> dict[str, Any]:
    import torch
    from cortex_backend.engine.model_state import ModelState
    from cortex_backend.engine.trainer import Trainer
    from cortex_backend.engine.transformers_sampler import TransformersSampler
    from cortex_backend.models import ModelCatalog

    device = "cpu" if dry_run else "cuda"
    sizes = DRY_RUN_SIZES if dry_run else GPU_SIZES
    shape = SHAPES[shape_name]
    counts = parameter_counts(shape.config)
    summary = device_summary(device)
    peak_flops, hbm = peaks_for(summary["name"], peak_tflops, hbm_tbps) if device == "cuda" else (None, None)
    info = ModelCatalog({"check": model_dir}).get("check")
    spec = {"lora": LORA, "seed": 1, "max_seq_len": 2048}
    vocab = shape.config["vocab_size"]
    rng = np.random.default_rng(0)
    record: dict[str, Any] = {"shape": shape_name, "parameters": counts, "checks": {}, "measures": {}}

    # bf16 training against an fp32 reference (on a CPU dry run too: torch runs bf16 there).
    trainer = Trainer(ModelState(info, spec, dtype=torch.bfloat16), {"lr": 1e-3})
    reference = Trainer(ModelState(info, spec, dtype=torch.float32), {"lr": 1e-3})
    batches = [
        checks.random_batch(rng, vocab, sizes.parity_rows, sizes.parity_length)
        for _ in range(sizes.parity_batches)
    ]
    probe = checks.random_batch(rng, vocab, 2, sizes.parity_length)
    attempt(
        record["checks"],
        "training_parity",
        lambda ref=reference: checks.training_parity(trainer, ref, batches, probe, "bfloat16"),
    )
    del reference
    gc.collect()
    # An adapter host's optimizer offload: moments in host memory between steps, the same steps bitwise.
    attempt(
        record["checks"],
        "optimizer_offload",
        lambda: checks.optimizer_offload(
            lambda: Trainer(ModelState(info, spec, dtype=torch.bfloat16), {"lr": 1e-3}), batches
        ),
    )
    gc.collect()

    # A sampler sub-job's model in the device's precision, given the trainer's adapter as a weight sync does.
    # (On a CPU both sides sample in fp32, the trainer with its bf16-trained adapter carried over.)
    engine_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if engine_dtype != torch.bfloat16:
        trainer.state.model.to(engine_dtype)
        trainer.state.dtype = engine_dtype
    sampler_state = ModelState(info, spec, dtype=engine_dtype)
    record["checks"]["sync"] = checks.sync_adapter(trainer.state, sampler_state)
    prompts = [rng.integers(3, vocab, size=sizes.decode_prompt).tolist() for _ in range(sizes.sync_prompts)]
    greedy = {"max_tokens": sizes.sync_tokens, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
    expected = TransformersSampler(trainer.state).generate(prompts, greedy)

    engines = {"transformers": TransformersSampler(sampler_state, merge_lora=True)}
    if importlib.util.find_spec("vllm") is not None:
        from cortex_backend.engine.vllm_sampler import VllmSampler

        options = {"gpu_memory_fraction": 0.45, "cpu_kv_cache_gib": 1}
        attempt(engines, "vllm", lambda: VllmSampler(sampler_state, options))
        if isinstance(engines["vllm"], dict):  # it failed to start: recorded as an error
            record["checks"]["sampler_vs_trainer_vllm"] = engines.pop("vllm")
    else:
        record["checks"]["sampler_vs_trainer_vllm"] = {
            "error": "vLLM is not installed in this Python (pip install 'cortex-nb[vllm]')"
        }

    def agreement(engine) -> dict[str, Any]:
        got = engine.generate(prompts, greedy)
        return checks.sampler_agrees(
            trainer.state,
            prompts,
            [s["tokens"] for s in expected["samples"]],
            [s["tokens"] for s in got["samples"]],
            [s["logprobs"] for s in got["samples"]],
        )

    for name, engine in engines.items():
        attempt(record["checks"], f"sampler_vs_trainer_{name}", lambda engine=engine: agreement(engine))

    train_batch = checks.random_batch(rng, vocab, sizes.train_rows, sizes.train_length)
    attempt(
        record["measures"],
        "lora_training",
        lambda: measures.training_throughput(
            trainer, train_batch, shape.config, counts["linear"], peak_flops, device, sizes.repeats
        ),
    )
    element_bytes = torch.finfo(engine_dtype).bits // 8
    for name, engine in engines.items():
        attempt(
            record["measures"],
            f"decode_batch1_{name}",
            lambda engine=engine: measures.batch1_decode(
                engine,
                prompts[0],
                sizes.decode_tokens,
                shape.config,
                counts["total"],
                element_bytes,
                hbm,
                device,
                sizes.repeats,
            ),
        )

    rl_prompts = [
        rng.integers(3, vocab, size=sizes.rl_prompt_length).tolist() for _ in range(sizes.rl_prompts)
    ]
    rl = {
        "max_tokens": sizes.rl_tokens,
        "temperature": 1.0,
        "n": sizes.rl_samples,
        "seed": 0,
        "ignore_eos": True,
    }
    runs = {
        name: (lambda engine=engine: engine.generate(rl_prompts, rl)["generated_tokens"])
        for name, engine in engines.items()
    }
    runs["transformers generate"] = measures.hf_generate(
        trainer.state.model, rl_prompts, sizes.rl_samples, sizes.rl_tokens, device
    )

    def rl_sampling() -> dict[str, Any]:
        with torch.no_grad():
            rows = measures.rl_sampling(runs, device, max(1, sizes.repeats - 1))
        shape_text = f"{sizes.rl_prompts}x{sizes.rl_samples}x{sizes.rl_tokens}"
        return {"shape": shape_text, "engines": rows, "goal_vllm_ratio": 3.0}

    attempt(record["measures"], "rl_sampling", rl_sampling)
    record["device"] = summary
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shape")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--hbm-tbps", type=float, default=None)
    args = parser.parse_args()
    record = run(args.shape, args.model_dir, args.dry_run, args.peak_tflops, args.hbm_tbps)
    args.out.write_text(json.dumps(record, default=float))


if __name__ == "__main__":
    main()
