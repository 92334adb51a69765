"""Weight sync through the real service: bytes moved by fp16 deltas against full transfers, the
zstd ratio of each, and the sync's milliseconds, for LoRA rank 16, all measured in one run.

    python bench/bench_weight_sync.py [--rank 16] [--steps 100] [--model NAME=DIR]

One trainer and two samplers (same seed, so both start from the trainer's initial adapter):
- after 1 step:    sampler-0 takes a delta (initial -> step 1); then a full transfer of the same state;
- train to step N-1, sync sampler-0; one more step:
- after 1 more step late in training: sampler-0 takes a delta (step N-1 -> step N);
- after N steps:   sampler-1, never synced, takes a delta (initial -> step N); then a full transfer.

Bytes are the compressed payloads the trainer sent (`raw` is before zstd); ms is the trainer's
wall time for the whole exchange (base, payload, verdict), and the client's round trip beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def batches(vocab: int, count: int, rows: int = 4, length: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        ids = rng.integers(0, vocab, (rows, length))
        yield {
            "input_ids": ids,
            "target_tokens": np.roll(ids, -1, 1),
            "weights": np.ones((rows, length), np.float32),
        }


def train(job, vocab: int, count: int, seed: int) -> None:
    pending = [(job.forward_backward(b), job.step()) for b in batches(vocab, count, seed=seed)]
    for forward_backward, step in pending:
        forward_backward.result()
        step.result()


def sync(job, target: str, weight_format: str) -> dict:
    started = time.perf_counter()
    result = job.sync_sampler(targets=[target], weight_format=weight_format).result()
    report = result["targets"][0]
    return {
        "path": report["path"],
        "bytes": report["bytes"],
        "raw_bytes": report["raw_bytes"],
        "zstd_ratio": report["raw_bytes"] / report["bytes"],
        "encodings": report["encodings"],
        "max_abs_error": report["max_abs_error"],
        "sync_ms": result["ms"],
        "round_trip_ms": (time.perf_counter() - started) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--model", default=None, metavar="NAME=DIR", help="a registered model instead of tiny"
    )
    args = parser.parse_args()

    model = "tiny"
    extra: list[str] = []
    if args.model:
        model = args.model.partition("=")[0]
        extra = ["--model", args.model]
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:4", "--warm-workers", "0", *extra)
        try:
            with Client(backend.url, backend.token) as client:
                vocab = next(m["vocab_size"] for m in client.list_models() if m["name"] == model)
                lora = {"r": args.rank, "alpha": 2 * args.rank}
                with client.create_training_job(
                    model, lora=lora, optimizer={"lr": args.lr}, samplers=2, seed=0
                ) as job:
                    parameters = job.info["sub_jobs"][0]["info"]["trainable_parameters"]
                    rows = {}
                    train(job, vocab, 1, seed=1)
                    rows["after 1 step: delta"] = sync(job, "sampling-0", "lora")
                    rows["after 1 step: full"] = sync(job, "sampling-0", "full")
                    train(job, vocab, args.steps - 2, seed=2)
                    sync(job, "sampling-0", "lora")
                    train(job, vocab, 1, seed=3)
                    rows[f"step {args.steps - 1} -> {args.steps}: delta"] = sync(job, "sampling-0", "lora")
                    rows[f"after {args.steps} steps: delta"] = sync(job, "sampling-1", "lora")
                    rows[f"after {args.steps} steps: full"] = sync(job, "sampling-1", "full")
        finally:
            backend.stop()

    print(
        f"weight sync, {model}, LoRA r={args.rank} ({parameters:,} adapter parameters, {parameters * 4:,} fp32 bytes),"
        f" AdamW lr={args.lr}, CPU"
    )
    header = f"{'':32} {'path':>5} {'bytes':>10} {'raw':>10} {'zstd':>6} {'sync ms':>8} {'trip ms':>8} {'max |err|':>10}"
    print(header)
    for name, row in rows.items():
        print(
            f"{name:32} {row['path']:>5} {row['bytes']:>10,} {row['raw_bytes']:>10,} {row['zstd_ratio']:>5.2f}x"
            f" {row['sync_ms']:>8.1f} {row['round_trip_ms']:>8.1f} {row['max_abs_error']:>10.2e}"
        )
    first_delta, first_full = rows["after 1 step: delta"], rows["after 1 step: full"]
    late_delta = rows[f"step {args.steps - 1} -> {args.steps}: delta"]
    last_delta, last_full = rows[f"after {args.steps} steps: delta"], rows[f"after {args.steps} steps: full"]
    print("ratios (same run):")
    print(f"  delta / full bytes, after 1 step:        {first_delta['bytes'] / first_full['bytes']:.3f}")
    print(
        f"  delta / full bytes, after {args.steps} steps:     {last_delta['bytes'] / last_full['bytes']:.3f}"
    )
    print(
        f"  delta / full bytes, one step at step {args.steps}:  {late_delta['bytes'] / last_full['bytes']:.3f}"
    )
    print(f"  delta / full sync ms, after 1 step:      {first_delta['sync_ms'] / first_full['sync_ms']:.3f}")
    print(
        f"  delta / full sync ms, after {args.steps} steps:   {last_delta['sync_ms'] / last_full['sync_ms']:.3f}"
    )
    print(json.dumps({"model": model, "rank": args.rank, "parameters": parameters, "rows": rows}))


if __name__ == "__main__":
    main()
