"""Core speed, as ratios against baselines measured in the same run (machines here are noisy).

    python bench/bench_core.py [--repeats N]

- no-op request round trip (submit + result) vs a bare GET /version round trip
- forward_backward through the service vs the same peft model in-process (tiny, batch 8x128)
- generate tokens/s through the service vs transformers' generate in-process (greedy, 8 prompts)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def batch(rows: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(rows, length + 1))
    return {"input_ids": tokens[:, :-1], "target_tokens": tokens[:, 1:], "weights": np.ones((rows, length), np.float32)}


def in_process_model():
    import torch
    from cortex_backend.engine.loading import build_tiny
    from cortex_backend.engine.lora import apply_lora

    model = apply_lora(build_tiny(), {"r": 16, "alpha": 32}, seed=0)
    model.eval()
    return model, torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:2")
        try:
            client = Client(backend.url, backend.token)
            job = client.create_training_job("tiny", lora={"r": 16, "alpha": 32})
            headers = {"Authorization": f"Bearer {backend.token}"}
            with httpx.Client() as http:
                version = timed(lambda: http.get(backend.url + "/version", headers=headers), args.repeats * 5)
            noop = timed(lambda: client.poll_request(job.job_id, client.noop(job.job_id)), args.repeats * 5)

            data = batch(8, 128)
            job.forward_backward(data).result()  # warm-up
            service_fb = timed(lambda: job.forward_backward(data).result(), args.repeats)
            prompts = [list(range(65, 65 + 16))] * 8
            job.generate(prompts, max_tokens=8, temperature=0).result()
            service_gen = []
            for _ in range(max(args.repeats // 4, 3)):
                started = time.perf_counter()
                result = job.generate(prompts, max_tokens=128, temperature=0, ignore_eos=True).result()
                service_gen.append(result.raw["generated_tokens"] / (time.perf_counter() - started))
            job.cancel()
        finally:
            backend.stop()

    # In-process baselines, run after the service is gone so they do not compete for the CPU.
    model, torch = in_process_model()
    tensors = {k: torch.from_numpy(v) for k, v in data.items()}

    def fb_in_process():
        logits = model(input_ids=tensors["input_ids"]).logits
        logprobs = -torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tensors["target_tokens"].reshape(-1), reduction="none")
        (-(logprobs * tensors["weights"].reshape(-1)).sum()).backward()

    fb_in_process()
    local_fb = timed(fb_in_process, args.repeats)
    input_ids = torch.tensor(prompts)
    local_gen = []
    with torch.no_grad():
        model.generate(input_ids=input_ids, max_new_tokens=8, do_sample=False)
        for _ in range(max(args.repeats // 4, 3)):
            started = time.perf_counter()
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=128,
                                 min_new_tokens=128, do_sample=False)
            local_gen.append((out.shape[1] - input_ids.shape[1]) * out.shape[0] / (time.perf_counter() - started))

    print(f"{'measure':58s} {'value':>12s}")
    print(f"{'GET /version round trip (median ms)':58s} {median_ms(version):12.2f}")
    print(f"{'no-op request submit+result (median ms)':58s} {median_ms(noop):12.2f}")
    print(f"{'  ratio no-op / GET /version':58s} {median_ms(noop) / median_ms(version):12.2f}")
    print(f"{'forward_backward 8x128 via service (median ms)':58s} {median_ms(service_fb):12.2f}")
    print(f"{'forward_backward 8x128 in-process (median ms)':58s} {median_ms(local_fb):12.2f}")
    print(f"{'  ratio service / in-process':58s} {median_ms(service_fb) / median_ms(local_fb):12.2f}")
    print(f"{'generate 8x128 greedy via service (tokens/s, median)':58s} {statistics.median(service_gen):12.0f}")
    print(f"{'transformers generate in-process (tokens/s, median)':58s} {statistics.median(local_gen):12.0f}")
    print(f"{'  ratio service / transformers':58s} {statistics.median(service_gen) / statistics.median(local_gen):12.2f}")


if __name__ == "__main__":
    main()
