"""Time to the first sample of a finished run, sampled on demand, against the same run kept alive.

    python bench/bench_sample_on_demand.py [--repeats 5] [--max-tokens 16]

Starts a real backend on loopback (the built-in `tiny` model, two CPU slots) and trains one short run with
`keep_alive`. While it keeps its device, `job.generate` answers from the trainer itself; once completed,
the same call starts a short-lived sampling job that loads the run's `final` checkpoint, samples and
ends (`%%cortex sample --job ID` on a finished run does the same). For each: the whole call's time, from
submit to the answer; medians over `--repeats`, and their ratio. The greedy tokens are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))

PROMPTS = ["2+3=", "7+5=", "The lighthouse keeper"]


def timed_generate(job, max_tokens: int):
    started = time.perf_counter()
    result = job.generate(PROMPTS, max_tokens=max_tokens, temperature=0.0).result()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()

    from cortex_nb import Client
    from cortex_nb.demo_data import addition_problems
    from tests.backend_process import start_backend

    spec = {"base_model": "tiny", "steps": 8, "batch_size": 8, "max_seq_len": 32, "seed": 3}
    with tempfile.TemporaryDirectory() as scratch:
        backend = start_backend(Path(scratch) / "backend", "--devices", "cpu:2", "--worker-threads", "1")
        try:
            with Client(backend.url, backend.token) as client:
                job = client.train({**spec, "data": addition_problems(), "keep_alive": "30m"}, name="bench")
                job.wait(timeout_s=600)
                timed_generate(job, args.max_tokens)  # warm up
                kept = [timed_generate(job, args.max_tokens) for _ in range(args.repeats)]
                job.complete(wait=True)
                on_demand = [timed_generate(job, args.max_tokens) for _ in range(args.repeats)]
        finally:
            backend.stop()
    assert all(result.tokens == kept[0][1].tokens for _, result in kept + on_demand), "greedy tokens differ"
    assert all(result.checkpoint_id == "final" for _, result in on_demand)
    kept_s = statistics.median(seconds for seconds, _ in kept)
    demand_s = statistics.median(seconds for seconds, _ in on_demand)
    print(f"{len(PROMPTS)} prompts x {args.max_tokens} greedy tokens, median of {args.repeats}:")
    print(f"  kept alive (the trainer samples)          {kept_s * 1000:8.1f} ms")
    print(f"  finished, on demand (a sampling job)      {demand_s * 1000:8.1f} ms")
    print(f"  on demand / kept alive                    {demand_s / kept_s:8.2f}x")


if __name__ == "__main__":
    main()
