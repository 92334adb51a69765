"""What router replay costs, as ratios within one run on a tiny random Mixtral: a generate that records routes
against the same generate without, and a forward_backward that replays them against the same one routing freely.

    python bench/bench_router_replay.py [--repeats 5] [--samples 8] [--max-tokens 32]

Starts a real backend on loopback (one CPU slot, one thread) with the tiny Mixtral of tests/model_factory.py
registered by --model, makes a job with a trainer and a sampler, and times each pair alternately
(`--repeats` times, medians): recording runs one extra forward per sample after sampling; replay adds
hooks and the service adds the routes to the frame.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from cortex_nb import Client
    from tests.backend_process import start_backend
    from tests.model_factory import build_mixtral_dir

    prompt = [5, 17, 42, 99, 7, 8, 250, 31]
    params = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True, "n": args.samples}
    with tempfile.TemporaryDirectory() as scratch:
        model = build_mixtral_dir(Path(scratch) / "tiny-mixtral")
        backend = start_backend(
            Path(scratch) / "backend",
            "--model",
            f"tiny-mixtral={model}",
            "--devices",
            "cpu:2",
            "--worker-threads",
            "1",
        )
        try:
            with Client(backend.url, backend.token) as client:
                sub = {"base_model": "tiny-mixtral", "lora": {"r": 8, "alpha": 16}, "max_seq_len": 128}
                job_id = client.create_job([{**sub, "type": "training"}, {**sub, "type": "sampling"}])[
                    "job_id"
                ]
                client.wait_for_job(job_id, timeout_s=120)

                def generate(record: bool) -> tuple[float, list[dict]]:
                    started = time.perf_counter()
                    request = client.api.generate(
                        job_id, [prompt], {**params, "record_routes": record}, sub_job="sampling-0"
                    )["request_id"]
                    samples = client.poll_request(job_id, request, 300)["samples"]
                    return time.perf_counter() - started, samples

                def train(batch: dict, ids: list[str] | None) -> float:
                    started = time.perf_counter()
                    client.poll_request(
                        job_id, client.forward_backward(job_id, batch, router_replay=ids), 300
                    )
                    return time.perf_counter() - started

                generate(True)  # warm up
                plain, recording, free, replayed = [], [], [], []
                for _ in range(args.repeats):
                    plain.append(generate(False)[0])
                    elapsed, samples = generate(True)
                    recording.append(elapsed)
                    rows = np.array([prompt + s["tokens"] for s in samples])
                    batch = {
                        "input_ids": rows[:, :-1],
                        "target_tokens": rows[:, 1:],
                        "weights": np.ones(rows[:, 1:].shape, np.float32),
                    }
                    free.append(train(batch, None))
                    replayed.append(train(batch, [s["routes_id"] for s in samples]))
                client.router_replay_discard(job_id)
                client.cancel_job(job_id)
        finally:
            backend.stop()

    def median(values: list[float]) -> float:
        return statistics.median(values)

    print(f"{args.samples} samples x {args.max_tokens} tokens, {args.repeats} repeats (medians)")
    print(f"generate: plain {median(plain):.3f}s, recording routes {median(recording):.3f}s")
    print(f"  recording / plain = {median(recording) / median(plain):.2f}")
    print(f"forward_backward: free routing {median(free):.3f}s, replayed {median(replayed):.3f}s")
    print(f"  replayed / free = {median(replayed) / median(free):.2f}")


if __name__ == "__main__":
    main()
