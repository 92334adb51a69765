"""Static cache and `torch.compile` for the RL-shaped sampling call, on this machine, as ratios in one run.

    python bench/bench_sampling_compile.py [--repeats 3] [--threads 2] [--model-dir DIR]

transformers' `generate` on the LoRA-merged model (8 prompts x 8 samples x 128 tokens, temperature 1) with
its dynamic cache (the baseline), with a static cache, and with a static cache plus `torch.compile`
(forced on a CPU, where transformers does not compile by default), next to the built-in engine. The
compile's first call (the warm-up) is printed separately: a sampler pays it again for every new shape.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sampling import build_state, prompts_of  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=None)
    args = parser.parse_args()
    import torch
    from cortex_backend.engine.transformers_sampler import TransformersSampler
    from transformers import CompileConfig

    torch.set_num_threads(args.threads)
    ours = TransformersSampler(build_state(args.model_dir), merge_lora=True)
    merged = copy.deepcopy(build_state(args.model_dir).model).merge_and_unload().eval()
    prompts = prompts_of(8, int(merged.config.vocab_size), seed=1)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    compile_on_cpu = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    compile_on_cpu._compile_all_devices = True  # transformers compiles only on accelerators unless told

    def generate(**options):
        with torch.no_grad():
            merged.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=128,
                min_new_tokens=128,
                num_return_sequences=8,
                pad_token_id=0,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                **options,
            )

    runs = {
        "generate merged, dynamic cache": generate,
        "generate merged, static cache": lambda: generate(
            cache_implementation="static", disable_compile=True
        ),
        "generate merged, static + compile": lambda: generate(
            cache_implementation="static", compile_config=compile_on_cpu
        ),
        "ours": lambda: ours.generate(
            prompts, {"max_tokens": 128, "temperature": 1.0, "n": 8, "seed": 3, "ignore_eos": True}
        ),
    }
    print(
        f"model: {args.model_dir or 'tiny'}, fp32, {args.threads} thread(s), {args.repeats} alternating repeats"
    )
    for name, run in runs.items():
        started = time.perf_counter()
        run()
        print(f"first call (warm-up) {name:34s} {time.perf_counter() - started:6.1f} s")
    wall: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            wall[name].append(time.perf_counter() - started)
    base = statistics.median(wall["generate merged, dynamic cache"])
    for name, times in wall.items():
        median = statistics.median(times)
        print(
            f"{name:34s} median {median:6.2f} s  ratio {base / median:5.2f}x  runs {[round(t, 2) for t in times]}"
        )


if __name__ == "__main__":
    main()
