"""Aggregate throughput of N jobs on one adapter host with `--batch-across-slots all` against `off` (the
slots then take turns, one request at a time), and against N worker processes (`--isolation-per-job`), as
ratios within one run.

    python bench/bench_slot_batching.py [--part sample|train] [--jobs 8] [--requests 4] [--max-tokens 32]
        [--rows 4] [--length 64] [--repeats 3] [--model tiny|HIDDEN:LAYERS]

For each mode: a real backend on loopback (the built-in `tiny` model, `--devices cpu:<jobs>`, one torch
thread per worker), `--jobs` training jobs of different LoRA ranks, then `--jobs` client threads that each
send `--requests` requests one after another to their own job, all starting at once. `sample`: generates
at temperature 1 with `ignore_eos`, so each decodes `--max-tokens` tokens. `train`: a forward_backward of
`--rows` x `--length` tokens then a step. Prints the median aggregate tokens/s of each mode, the ratios,
and how many passes ran several slots' requests together. `--model 576:10` uses a random Llama of that
width and depth (bench_bigger_bases.py) instead of `tiny`.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))
sys.path.insert(0, str(ROOT / "bench"))

from at_once import run_at_once  # noqa: E402

PASS_LINES = {"sample": "slots sampled in one pass", "train": "slots in one pass"}
MODES = {
    "one host, batched across slots": ("--adapter-host", "--batch-across-slots", "all"),
    "one host, slots take turns": ("--adapter-host", "--batch-across-slots", "off"),
    "a worker process per job": ("--isolation-per-job",),
}


def measure(args: argparse.Namespace, flags: tuple[str, ...]) -> tuple[list[float], int]:
    """Aggregate tokens/s of each repeat, and the passes that sampled several slots' requests."""
    import numpy as np

    from cortex_nb import Client
    from tests.backend_process import start_backend
    from tests.reference import random_batch

    params = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as scratch:
        model, model_flags = "tiny", ()
        if args.model != "tiny":
            from bench_bigger_bases import build_model_dir

            hidden, layers = (int(part) for part in args.model.split(":"))
            model, model_flags = (
                "llama-random",
                ("--model", f"llama-random={build_model_dir(Path(scratch) / 'llama', hidden, layers)}"),
            )
        backend = start_backend(
            Path(scratch) / "backend",
            *flags,
            *model_flags,
            "--devices",
            f"cpu:{args.jobs}",
            "--worker-threads",
            "1",
        )
        try:
            with Client(backend.url, backend.token) as client:
                jobs = [
                    client.create_training_job(model, lora={"r": 4 * (1 + index % 4)}, seed=index)
                    for index in range(args.jobs)
                ]
                for job in jobs:
                    job.generate([[1, 2, 3]], **params).result()  # warm up

                def work(job, index: int) -> int:
                    """One client's requests; the tokens they computed."""
                    if args.part == "sample":
                        for request in range(args.requests):
                            job.generate([[3, 1, 4, 1, 5, index, request]], **params).result()
                        return args.requests * args.max_tokens
                    rng = np.random.default_rng(index)
                    for _ in range(args.requests):
                        job.forward_backward(
                            random_batch(rng, 259, batch=args.rows, length=args.length)
                        ).result()
                        job.step().result()
                    return args.requests * args.rows * args.length

                def once() -> float:
                    seconds, done = run_at_once(
                        [functools.partial(work, job, index) for index, job in enumerate(jobs)]
                    )
                    return sum(done) / seconds

                rates = [once() for _ in range(args.repeats)]
                passes = sum(
                    PASS_LINES[args.part] in line["line"] for line in jobs[0].logs(limit=5000)["lines"]
                )
                for job in jobs:
                    job.cancel()
        finally:
            backend.stop()
    return rates, passes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("sample", "train"), default="sample")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny", help="tiny, or HIDDEN:LAYERS for a random Llama")
    args = parser.parse_args()
    results = {name: measure(args, flags) for name, flags in MODES.items()}
    batched = statistics.median(results["one host, batched across slots"][0])
    each = (
        f"generates x {args.max_tokens} tokens"
        if args.part == "sample"
        else f"forward_backward + step of {args.rows}x{args.length} tokens"
    )
    print(f"{args.jobs} jobs x {args.requests} {each}, median of {args.repeats}:")
    for name, (rates, passes) in results.items():
        rate = statistics.median(rates)
        print(
            f"  {name:32} {rate:9.0f} tokens/s   batched / this {batched / rate:5.2f}"
            f"   passes of several slots (job 0): {passes}"
        )


if __name__ == "__main__":
    main()
