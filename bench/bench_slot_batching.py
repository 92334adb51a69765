"""Aggregate sampling throughput of N jobs on one adapter host with `--batch-across-slots on` against `off`
(the slots then take turns, one generate at a time), and against N worker processes (`--isolation-per-job`),
as ratios within one run.

    python bench/bench_slot_batching.py [--jobs 8] [--requests 4] [--max-tokens 32] [--repeats 3]

For each mode: a real backend on loopback (the built-in `tiny` model, `--devices cpu:<jobs>`, one torch
thread per worker), `--jobs` training jobs of different LoRA ranks, then `--jobs` client threads that each
send `--requests` generates one after another to their own job, all starting at once (temperature 1,
`ignore_eos`, so each decodes `--max-tokens` tokens). Prints the median aggregate tokens/s of each mode,
the ratios, and how many passes sampled several slots' requests together.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))

PASS_LINE = "slots sampled in one pass"
MODES = {
    "one host, batched across slots": ("--adapter-host", "--batch-across-slots", "on"),
    "one host, slots take turns": ("--adapter-host", "--batch-across-slots", "off"),
    "a worker process per job": ("--isolation-per-job",),
}


def measure(args: argparse.Namespace, flags: tuple[str, ...]) -> tuple[list[float], int]:
    """Aggregate tokens/s of each repeat, and the passes that sampled several slots' requests."""
    from cortex_nb import Client
    from tests.backend_process import start_backend

    params = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as scratch:
        backend = start_backend(
            Path(scratch) / "backend", *flags, "--devices", f"cpu:{args.jobs}", "--worker-threads", "1"
        )
        try:
            with Client(backend.url, backend.token) as client:
                jobs = [
                    client.create_training_job("tiny", lora={"r": 4 * (1 + index % 4)}, seed=index)
                    for index in range(args.jobs)
                ]
                for job in jobs:
                    job.generate([[1, 2, 3]], **params).result()  # warm up

                def once() -> float:
                    go = threading.Barrier(args.jobs + 1)

                    def client_of(job, index: int) -> None:
                        go.wait()
                        for request in range(args.requests):
                            job.generate([[3, 1, 4, 1, 5, index, request]], **params).result()

                    threads = [
                        threading.Thread(target=client_of, args=(job, i)) for i, job in enumerate(jobs)
                    ]
                    for thread in threads:
                        thread.start()
                    go.wait()
                    started = time.perf_counter()
                    for thread in threads:
                        thread.join()
                    tokens = args.jobs * args.requests * args.max_tokens
                    return tokens / (time.perf_counter() - started)

                rates = [once() for _ in range(args.repeats)]
                passes = sum(PASS_LINE in line["line"] for line in jobs[0].logs(limit=5000)["lines"])
                for job in jobs:
                    job.cancel()
        finally:
            backend.stop()
    return rates, passes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {name: measure(args, flags) for name, flags in MODES.items()}
    batched = statistics.median(results["one host, batched across slots"][0])
    print(
        f"{args.jobs} jobs x {args.requests} generates x {args.max_tokens} tokens, median of {args.repeats}:"
    )
    for name, (rates, passes) in results.items():
        rate = statistics.median(rates)
        print(
            f"  {name:32} {rate:9.0f} tokens/s   batched / this {batched / rate:5.2f}"
            f"   passes of several slots (job 0): {passes}"
        )


if __name__ == "__main__":
    main()
