"""The built-in sampler against transformers' `generate`, as ratios measured in one run.

    python bench/bench_sampling.py [--repeats 5] [--threads 2] [--model-dir DIR]

Both sides sample the same peft model (LoRA r=16 on every linear layer) in this process, the way a
sampling sub-job's worker does:
- RL-shaped: 8 prompts x 8 samples x 128 tokens at temperature 1 (no truncation);
- greedy: 32 prompts x 128 tokens.
`ours` is the built-in engine as a sampling sub-job runs it (one prefill per prompt for its samples,
LoRA merged into the sampler's own weights, decoding kept on the device); `ours, unmerged` is the same
engine as a trainer runs it. The baseline is `model.generate` on the peft model (batched, left-padded,
num_return_sequences for the samples); `generate, merged copy` shows how much of the gain merging
alone would give transformers. Every row runs to exactly max_tokens (no stop), so all produce the same
number of tokens. Runs alternate and medians are taken; wall time and this process's CPU time are both
shown (CPU time is steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))
# The same OpenMP setting the backend gives its workers, so both sides run like a worker.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_state(model_dir: Path | None, lora_seed: int = 0):
    """A sampling sub-job's model: the base model with a LoRA adapter whose B is not zero (a trained one)."""
    import torch
    from cortex_backend.engine.adapter import adapter_parameters
    from cortex_backend.engine.model_state import ModelState
    from cortex_backend.models import ModelCatalog

    catalog = ModelCatalog({"bench": model_dir} if model_dir else {})
    state = ModelState(
        catalog.get("bench" if model_dir else "tiny"), {"lora": {"r": 16, "alpha": 32}, "seed": lora_seed}
    )
    generator = torch.Generator().manual_seed(lora_seed)
    with torch.no_grad():
        for name, parameter in adapter_parameters(state.model).items():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return state


def prompts_of(count: int, vocab: int, seed: int, low: int = 32, high: int = 96) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(low, high))] for _ in range(count)]


def hf_generate(
    model, prompts: list[list[int]], max_tokens: int, samples: int, greedy: bool
) -> Callable[[], int]:
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling = (
        {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    )

    def run() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                num_return_sequences=samples,
                pad_token_id=0,
                **sampling,
            )
        return (out.shape[1] - width) * out.shape[0]

    return run


def measure(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, dict[str, float]]:
    for run in runs.values():  # warm-up
        run()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            started_wall, started_cpu = time.perf_counter(), time.process_time()
            tokens[name] = run()
            wall[name].append(time.perf_counter() - started_wall)
            cpu[name].append(time.process_time() - started_cpu)
    return {
        name: {
            "wall_s": statistics.median(wall[name]),
            "cpu_s": statistics.median(cpu[name]),
            "tokens": tokens[name],
        }
        for name in runs
    }


def report(title: str, results: dict[str, dict[str, float]], baseline: str) -> None:
    base = results[baseline]
    print(f"\n{title}")
    print(
        f"{'':34s} {'tokens':>7s} {'wall s':>8s} {'tokens/s':>9s} {'ratio':>6s} {'cpu s':>7s} {'cpu ratio':>9s}"
    )
    for name, row in results.items():
        print(
            f"{name:34s} {row['tokens']:7d} {row['wall_s']:8.2f} {row['tokens'] / row['wall_s']:9.0f}"
            f" {base['wall_s'] / row['wall_s']:5.2f}x {row['cpu_s']:7.2f} {base['cpu_s'] / row['cpu_s']:8.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (a CPU worker's --worker-threads)"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="a local Hugging Face model (default: tiny)"
    )
    args = parser.parse_args()
    import torch
    from cortex_backend.engine.transformers_sampler import TransformersSampler

    torch.set_num_threads(args.threads)
    sampler_state = build_state(args.model_dir)
    trainer_state = build_state(args.model_dir)  # the same weights, sampled unmerged as a trainer does
    ours = TransformersSampler(sampler_state, merge_lora=True)
    ours_unmerged = TransformersSampler(trainer_state)
    peft_model = build_state(args.model_dir).model.eval()
    merged_copy = copy.deepcopy(peft_model).merge_and_unload().eval()
    vocab = int(peft_model.config.vocab_size)

    def ours_run(engine, prompts, params) -> Callable[[], int]:
        return lambda: engine.generate(prompts, params)["generated_tokens"]

    print(
        f"model: {args.model_dir or 'tiny'} ({sum(p.numel() for p in merged_copy.parameters()):,} parameters),"
        f" LoRA r=16 all-linear, fp32, {args.threads} thread(s), {args.repeats} alternating repeats, medians"
    )

    rl_prompts = prompts_of(8, vocab, seed=1)
    rl = {"max_tokens": 128, "temperature": 1.0, "n": 8, "seed": 3, "ignore_eos": True}
    results = measure(
        {
            "transformers generate (peft)": hf_generate(peft_model, rl_prompts, 128, 8, greedy=False),
            "ours": ours_run(ours, rl_prompts, rl),
            "ours, unmerged (a trainer)": ours_run(ours_unmerged, rl_prompts, rl),
            "generate, merged copy": hf_generate(merged_copy, rl_prompts, 128, 8, greedy=False),
        },
        args.repeats,
    )
    report(
        "RL-shaped: 8 prompts x 8 samples x 128 tokens, temperature 1 (goal: ours >= 2x)",
        results,
        "transformers generate (peft)",
    )

    greedy_prompts = prompts_of(32, vocab, seed=2)
    greedy = {"max_tokens": 128, "temperature": 0.0, "ignore_eos": True}
    results = measure(
        {
            "transformers generate (peft)": hf_generate(peft_model, greedy_prompts, 128, 1, greedy=True),
            "ours": ours_run(ours, greedy_prompts, greedy),
            "ours, unmerged (a trainer)": ours_run(ours_unmerged, greedy_prompts, greedy),
            "generate, merged copy": hf_generate(merged_copy, greedy_prompts, 128, 1, greedy=True),
        },
        args.repeats,
    )
    report("greedy: 32 prompts x 128 tokens (goal: ours >= 1.2x)", results, "transformers generate (peft)")


if __name__ == "__main__":
    main()
