"""Core speed, as ratios against baselines measured in the same run (machines here are noisy).

    python bench/bench_core.py [--repeats N]

- no-op request round trip (submit + result) vs a bare GET /version round trip
- forward_backward through the service vs the same peft model in-process (tiny, batch 8x128)
- generate tokens/s through the service vs transformers' generate in-process (greedy, 8 prompts)

Service and in-process measurements alternate call by call, so load from other processes hits both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The same OpenMP setting the backend gives its workers, so the in-process baseline is like for like.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def batch(rows: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(rows, length + 1))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((rows, length), np.float32),
    }


def in_process_model():
    from cortex_backend.engine.loading import build_tiny
    from cortex_backend.engine.lora import apply_lora

    model = apply_lora(build_tiny(), {"r": 16, "alpha": 32}, seed=0)
    model.eval()
    return model


def row(label: str, value: float, digits: int = 2) -> None:
    print(f"{label:60s} {value:12.{digits}f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import torch

    model = in_process_model()
    data = batch(8, 128)
    tensors = {k: torch.from_numpy(v) for k, v in data.items()}
    prompts = [list(range(65, 65 + 16))] * 8
    input_ids = torch.tensor(prompts)

    def fb_in_process() -> None:
        logits = model(input_ids=tensors["input_ids"]).logits
        logprobs = -torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tensors["target_tokens"].reshape(-1), reduction="none"
        )
        (-(logprobs * tensors["weights"].reshape(-1)).sum()).backward()

    def generate_in_process() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=128,
                min_new_tokens=128,
                do_sample=False,
            )
        return (out.shape[1] - input_ids.shape[1]) * out.shape[0]

    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:2")
        try:
            client = Client(backend.url, backend.token)
            job = client.create_training_job("tiny", lora={"r": 16, "alpha": 32})
            headers = {"Authorization": f"Bearer {backend.token}"}
            version, noop = [], []
            with httpx.Client() as http:
                for _ in range(args.repeats * 5):
                    version.append(elapsed(lambda: http.get(backend.url + "/version", headers=headers)))
                    noop.append(elapsed(lambda: client.poll_request(job.job_id, client.noop(job.job_id))))

            job.forward_backward(data).result()  # warm-up, both sides
            fb_in_process()
            service_fb, local_fb = [], []
            for _ in range(args.repeats):
                service_fb.append(elapsed(lambda: job.forward_backward(data).result()))
                local_fb.append(elapsed(fb_in_process))

            job.generate(prompts, max_tokens=8, temperature=0).result()
            generate_in_process()
            service_gen, local_gen = [], []
            for _ in range(max(args.repeats // 4, 3)):
                started = time.perf_counter()
                tokens = (
                    job.generate(prompts, max_tokens=128, temperature=0, ignore_eos=True)
                    .result()
                    .raw["generated_tokens"]
                )
                service_gen.append(tokens / (time.perf_counter() - started))
                started = time.perf_counter()
                local_gen.append(generate_in_process() / (time.perf_counter() - started))
            job.cancel()
        finally:
            backend.stop()

    median = statistics.median
    print(f"{'measure (medians)':60s} {'value':>12s}")
    row("GET /version round trip (ms)", median(version) * 1000)
    row("no-op request, submit + result through the worker (ms)", median(noop) * 1000)
    row("  ratio no-op / GET /version", median(noop) / median(version))
    row("forward_backward 8x128 via the service (ms)", median(service_fb) * 1000)
    row("forward_backward 8x128 in-process (ms)", median(local_fb) * 1000)
    row("  ratio service / in-process", median(service_fb) / median(local_fb))
    row("generate 8 x 128 tokens greedy via the service (tokens/s)", median(service_gen), 0)
    row("transformers generate in-process (tokens/s)", median(local_gen), 0)
    row("  ratio service / transformers", median(service_gen) / median(local_gen))


if __name__ == "__main__":
    main()
