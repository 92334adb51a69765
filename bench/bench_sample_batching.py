"""Eight concurrent 1-sample generates against one 8-sample generate on the same sampler, as a ratio within
one run (issue 29: one at a time, the eight took 4.6 times as long).

    python bench/bench_sample_batching.py [--repeats 5] [--max-tokens 64] [--clients 8] [--tinker]

Starts a real backend on loopback (the built-in `tiny` model, one CPU slot, one thread), makes a sampling
job, then times, for each repeat: `--clients` threads each sending one 1-sample generate at the same moment
(as the Tinker cookbook's RL loops send one request per group), and one generate of `--clients` samples of
the same prompt. Sampled at temperature 1 with `ignore_eos`, so every sample decodes `--max-tokens` tokens.
Prints medians and their ratio, and how many engine passes the concurrent requests took (the worker logs
each pass that sampled several queued requests together). With `--tinker`, the same through the published
tinker SDK, as the cookbook calls it: a sampling client from `save_weights_and_get_sampling_client`, eight
`sample(prompt, 1, ...)` futures at once against one `sample(prompt, 8, ...)`.
"""

from __future__ import annotations

import argparse
import functools
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

PASS_LINE = "queued requests sampled in one pass"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tinker", action="store_true", help="through the tinker SDK's SamplingClient")
    args = parser.parse_args()
    if args.tinker:
        tinker_face(args)
        return

    from cortex_nb import Client
    from tests.backend_process import start_backend

    params = {"max_tokens": args.max_tokens, "temperature": 1.0, "ignore_eos": True}
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with tempfile.TemporaryDirectory() as scratch:
        backend = start_backend(Path(scratch) / "backend", "--devices", "cpu:1", "--worker-threads", "1")
        try:
            with Client(backend.url, backend.token) as client:
                sampler = client.create_sampler("tiny")
                sampler.generate([prompt], n=args.clients, **params).result()  # warm up

                def concurrent() -> float:
                    call = functools.partial(sampler.generate, [prompt], **params)
                    return run_at_once([lambda: call().result()] * args.clients)[0]

                def together() -> float:
                    started = time.perf_counter()
                    sampler.generate([prompt], n=args.clients, **params).result()
                    return time.perf_counter() - started

                concurrents, singles = [], []
                for _ in range(args.repeats):
                    concurrents.append(concurrent())
                    singles.append(together())
                lines = sampler.logs(limit=5000)["lines"]
                passes = [line["line"] for line in lines if PASS_LINE in line["line"]]
                sampler.cancel()
        finally:
            backend.stop()
    report(args, concurrents, singles, passes)


def tinker_face(args: argparse.Namespace) -> None:
    import tinker
    from tinker import types

    from cortex_nb import Client
    from tests.backend_process import start_backend
    from tests.tokens import create_token

    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    prompt = types.ModelInput.from_ints([3, 1, 4, 1, 5, 9, 2, 6])
    with tempfile.TemporaryDirectory() as scratch:
        backend = start_backend(Path(scratch) / "backend", "--devices", "cpu:1", "--worker-threads", "1")
        try:
            key = create_token(backend.data_dir, "bench", "jobs:read", "jobs:write", tinker=True)
            service = tinker.ServiceClient(base_url=backend.url, api_key=key)
            training = service.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
            sampler = training.save_weights_and_get_sampling_client().result()
            sampler.sample(prompt, args.clients, params).result()  # warm up

            def concurrent() -> float:
                started = time.perf_counter()
                futures = [sampler.sample(prompt, 1, params) for _ in range(args.clients)]
                for future in futures:
                    future.result()
                return time.perf_counter() - started

            def together() -> float:
                started = time.perf_counter()
                sampler.sample(prompt, args.clients, params).result()
                return time.perf_counter() - started

            concurrents, singles = [], []
            for _ in range(args.repeats):
                concurrents.append(concurrent())
                singles.append(together())
            with Client(backend.url, backend.token) as client:
                job_id = training.model_id.replace(":", ".")
                lines = client.api.job_logs(job_id, 0, 5000)["lines"]
                passes = [line["line"] for line in lines if PASS_LINE in line["line"]]
        finally:
            backend.stop()
    print("through the tinker SDK (SamplingClient.sample, EOS may end a sample early):")
    report(args, concurrents, singles, passes)


def report(
    args: argparse.Namespace, concurrents: list[float], singles: list[float], passes: list[str]
) -> None:
    many, one = statistics.median(concurrents), statistics.median(singles)
    print(f"{args.max_tokens} tokens per sample at most, median of {args.repeats}:")
    print(f"  {args.clients} concurrent 1-sample requests {many * 1000:8.1f} ms")
    print(f"  one {args.clients}-sample request         {one * 1000:8.1f} ms")
    print(f"  ratio                            {many / one:8.2f}")
    sizes = [line.split("generate: ")[1].split(" ")[0] for line in passes]
    print(f"  passes of several requests: {len(passes)} (requests per pass: {', '.join(sizes) or 'none'})")


if __name__ == "__main__":
    main()
