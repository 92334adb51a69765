"""N vLLM samplers as slots of one adapter host (one shared vLLM engine) against a vLLM engine per sampler
(`--isolation-per-job`): aggregate tokens/s and the backend tree's memory (PSS), as ratios within one run.

    CORTEX_VLLM_PYTHON=.venv-vllm/bin/python python bench/bench_vllm_slots.py [--jobs 4] [--requests 4]
        [--prompts 4] [--max-tokens 32] [--repeats 3] [--max-lora-rank 64] [--modes ...]

For each mode: a real backend on loopback from the vLLM venv (`--sampler vllm`, `--devices cpu:<2 x jobs>`, one
torch thread per worker), on a small random Llama (tests/model_factory.py), `--jobs` jobs each with a trainer
of its own LoRA rank and a vLLM sampler; then `--jobs` client threads that each send `--requests` generates
of `--prompts` prompts (temperature 1, `ignore_eos`, `--max-tokens` tokens) to their own sampler, all
starting at once; and, on the shared engine, the same requests one client after another (the engine then
decodes one tenant's requests at a time). Prints the median aggregate tokens/s of each, the ratios, and the
PSS of the backend's process tree with every job loaded; ratios are to the first mode of `--modes`.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT / "bench"))

from at_once import run_at_once  # noqa: E402
from bench_adapter_host import tree_pss_bytes  # noqa: E402

MODES = {
    "shared": ("one host, one shared vLLM engine", ("--adapter-host",)),
    "per-sampler": ("a vLLM engine per sampler", ("--isolation-per-job",)),
}


def measure(args: argparse.Namespace, flags: tuple[str, ...], python: str) -> dict:
    from cortex_nb import Client
    from cortex_nb.training import TrainingJob
    from tests.backend_process import start_backend
    from tests.model_factory import build_llama_dir

    params = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as scratch:
        llama = build_llama_dir(Path(scratch) / "llama")
        backend = start_backend(
            Path(scratch) / "backend",
            *flags,
            "--model",
            f"llama={llama}",
            "--devices",
            f"cpu:{2 * args.jobs}",  # a process slot each for the trainer and the sampler of every job
            "--sampler",
            "vllm",
            "--worker-threads",
            "1",
            "--warm-workers",
            "0",
            "--vllm-max-lora-rank",
            str(args.max_lora_rank),
            python=python,
            timeout_s=300,
        )
        try:
            with Client(backend.url, backend.token) as client:
                jobs = [
                    TrainingJob.create(
                        client, "llama", lora={"r": 8 * (1 + index % 2)}, samplers=1, seed=index
                    )
                    for index in range(args.jobs)
                ]
                samplers = [job.sub_jobs("sampling")[0] for job in jobs]
                prompts = [
                    [[3, 1, 4, 1, 5, index, p] for p in range(args.prompts)] for index in range(args.jobs)
                ]
                for job, sampler, prompt_list in zip(jobs, samplers, prompts, strict=True):
                    job.generate(prompt_list, sub_job=sampler, **params).result()  # warm up
                pss = tree_pss_bytes(backend.process.pid)

                def work(index: int) -> int:
                    for _ in range(args.requests):
                        jobs[index].generate(prompts[index], sub_job=samplers[index], **params).result()
                    return args.requests * args.prompts * args.max_tokens

                def at_once() -> float:
                    seconds, done = run_at_once(
                        [functools.partial(work, index) for index in range(args.jobs)]
                    )
                    return sum(done) / seconds

                def one_after_another() -> float:
                    started = time.perf_counter()
                    total = sum(work(index) for index in range(args.jobs))
                    return total / (time.perf_counter() - started)

                result = {
                    "at once": [at_once() for _ in range(args.repeats)],
                    "one after another": [one_after_another() for _ in range(args.repeats)],
                    "pss": pss,
                }
                for job in jobs:
                    job.cancel()
        finally:
            backend.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--max-lora-rank", type=int, default=64, help="the shared engine's (--vllm-max-lora-rank)"
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    args = parser.parse_args()
    python = os.environ.get("CORTEX_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    chosen = args.modes.split(",")
    results = {MODES[key][0]: measure(args, MODES[key][1], python) for key in chosen}
    shared = results[MODES[chosen[0]][0]]
    shared_rate = statistics.median(shared["at once"])
    print(
        f"{args.jobs} vLLM samplers x {args.requests} generates of {args.prompts} prompts x {args.max_tokens}"
        f" tokens, median of {args.repeats}:"
    )
    for name, result in results.items():
        for when in ("at once", "one after another"):
            rate = statistics.median(result[when])
            print(
                f"  {name:34} {when:18} {rate:8.0f} tokens/s   first at once / this {shared_rate / rate:5.2f}"
            )
        print(
            f"  {name:34} backend tree PSS {result['pss'] / 2**30:6.2f} GiB   / first {result['pss'] / shared['pss']:5.2f}"
        )


if __name__ == "__main__":
    main()
