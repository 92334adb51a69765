"""The Tinker face, as ratios and costs measured in one run.

    python bench/bench_tinker.py [--repeats N]

- forward_backward + optim_step through the published tinker SDK vs forward_backward + step through
  cortex_nb.Client, same batch (tiny, 8 x 128 tokens), same LoRA (rank 16, alpha 32, same modules), same backend,
  alternating step by step; the ratio of medians (goal <= 1.05)
- a new sampling client from saved weights: seconds to save + create it, seconds to its first sample, and the
  trainer worker's resident memory per extra sampling client (each is a saved adapter, swapped in per request),
  against the resident memory of a sampler job's own worker (what a process per sampling client would cost)
- how long the SDK takes to give up on a user error (unknown model, a datum whose lengths disagree, an unknown
  loss): the slowest of N, and the requests it made (one each: no retries)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402
from tests.tokens import create_token  # noqa: E402

MODEL, RANK = "tiny", 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
MIB = 2**20


def elapsed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def row(label: str, value: float, digits: int = 3) -> None:
    print(f"{label:72s} {value:12.{digits}f}", flush=True)


def resident_bytes(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def worker_pid(client: Client, job_id: str) -> int:
    """The worker process serving a job's (first) sub-job."""
    return int(client.get_job(job_id)["sub_jobs"][0]["info"]["pid"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--samplers", type=int, default=8)
    args = parser.parse_args()
    import tinker
    from tinker import types

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(8, 129))
    batch = {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((8, 128), np.float32),
    }
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints(t[:-1].tolist()),
            loss_fn_inputs={"target_tokens": t[1:].tolist(), "weights": [1.0] * 128},
        )
        for t in tokens
    ]
    adam = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)
    median = statistics.median
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:4", "--worker-threads", "1")
        try:
            key = create_token(backend.data_dir, "bench", "jobs:read", "jobs:write", tinker=True)
            service = tinker.ServiceClient(base_url=backend.url, api_key=key)
            training = service.create_lora_training_client(base_model=MODEL, rank=RANK, seed=0).result()
            ours = Client(backend.url, key)
            job = ours.create_training_job(
                MODEL,
                lora={"r": RANK, "alpha": 32, "target_modules": TARGETS},
                optimizer={"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8},
                seed=0,
            )
            job.wait_ready()

            def tinker_step() -> None:
                forward_backward, optim = (
                    training.forward_backward(datums, "cross_entropy"),
                    training.optim_step(adam),
                )
                forward_backward.result()
                optim.result()

            def our_step() -> None:
                forward_backward, step = job.forward_backward(batch), job.step()
                forward_backward.result()
                step.result()

            for _ in range(3):  # warm-up, both paths
                tinker_step()
                our_step()
            via_tinker, via_ours = [], []
            for _ in range(args.repeats):
                via_tinker.append(elapsed(tinker_step))
                via_ours.append(elapsed(our_step))
            print(
                f"forward_backward + optim_step, {MODEL} 8x128, rank {RANK}, {args.repeats} alternating steps (median s):"
            )
            row("  through the tinker SDK (protobuf, numbered requests, retrieve_future)", median(via_tinker))
            row("  through cortex_nb.Client (frame, long-poll)", median(via_ours))
            row("  ratio tinker / ours (goal <= 1.05)", median(via_tinker) / median(via_ours))
            job.cancel()

            # New sampling clients from saved weights: a checkpoint each, sampled on the trainer (no new process).
            prompt = types.ModelInput.from_ints(tokens[0, :16].tolist())
            params = types.SamplingParams(max_tokens=8, temperature=0.0)
            sampler = training.save_weights_and_get_sampling_client().result()
            sampler.sample(prompt, 1, params).result()
            trainer = worker_pid(ours, training.model_id.replace(":", "."))
            base = resident_bytes(trainer)
            to_client, to_sample = [], []
            for i in range(args.samplers):
                tinker_step()
                started = time.perf_counter()
                path = training.save_weights_for_sampler(f"bench-{i}").result().path
                sampler = service.create_sampling_client(model_path=path).result()
                to_client.append(time.perf_counter() - started)
                sampler.sample(prompt, 1, params).result()
                to_sample.append(time.perf_counter() - started)
            grown = resident_bytes(trainer) - base
            quick = []
            for _ in range(args.samplers):
                started = time.perf_counter()
                sampler = training.save_weights_and_get_sampling_client().result()
                sampler.sample(prompt, 1, params).result()
                quick.append(time.perf_counter() - started)
            print(f"a new sampling client from saved weights ({args.samplers} of them, median s):")
            row("  save_weights_for_sampler + create_sampling_client(model_path)", median(to_client))
            row("  ... + its first sample (adapter read from the checkpoint)", median(to_sample))
            row("  save_weights_and_get_sampling_client + first sample", median(quick))
            row(
                "  trainer worker's resident memory per new sampling client (MiB)",
                grown / args.samplers / MIB,
                2,
            )
            sizes = [
                c.size_bytes
                for c in tinker.RestClient(base_url=backend.url, api_key=key)
                .list_checkpoints(training.model_id)
                .result()
                .checkpoints
                if c.checkpoint_id.startswith("sampler_weights/bench-")
            ]
            row("  one saved adapter (its checkpoint's size, MiB)", median(sizes) / MIB, 2)
            other = ours.create_sampler(MODEL, lora={"r": RANK, "alpha": 32, "target_modules": TARGETS})
            other.generate([[1, 2, 3]], max_tokens=2).result()
            row(
                "  for comparison: a sampler job's own worker, resident (MiB)",
                resident_bytes(worker_pid(ours, other.job_id)) / MIB,
                1,
            )
            other.cancel()

            # User errors: one request, an answer the SDK does not retry.
            bad_datum = types.Datum(
                model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0] * 4},
            )
            cases = {
                "unknown model": lambda: service.create_lora_training_client(
                    base_model="Qwen/Qwen3-Nope"
                ).result(),
                "a datum whose lengths disagree": lambda: training.forward_backward(
                    [bad_datum], "cross_entropy"
                ).result(),
                "an unknown loss": lambda: training.forward_backward(datums[:1], "cispo").result(),
            }
            print(f"seconds until the SDK raises a user error (slowest of {args.repeats}):")
            for label, call in cases.items():
                slowest = 0.0
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    try:
                        call()
                    except tinker.BadRequestError:
                        pass
                    slowest = max(slowest, time.perf_counter() - started)
                row(f"  {label}", slowest)
            service.close("success").result()
            ours.close()
        finally:
            backend.stop()


if __name__ == "__main__":
    main()
