"""Time to the first streamed token against the whole streamed call, as a ratio within one run.

    python bench/bench_generate_stream.py [--repeats 5] [--max-tokens 128] [--vllm]

Starts a real backend on loopback (the built-in `tiny` model, one CPU slot), makes a sampling job, and
streams a greedy generate of `--max-tokens` tokens (`ignore_eos`, so every call decodes them all) through
`Sampler.generate_stream()`. For each call: the time to the first `tokens` piece, the whole call's time,
and their ratio; then the same call unstreamed (submit + poll) for the cost of streaming itself.
Medians over `--repeats`.

`--vllm`: the same on the vLLM engine (`--sampler vllm`), with the backend run by the Python that has vLLM
(CORTEX_VLLM_PYTHON, else .venv-vllm) on the small Llama the vLLM tests build (vLLM's CPU attention needs
heads 32 wide; `tiny`'s are narrower).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--vllm", action="store_true", help="sample on the vLLM engine")
    args = parser.parse_args()

    from cortex_nb import Client
    from tests.backend_process import start_backend

    params = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as scratch:
        model, options = "tiny", {}
        arguments = ["--devices", "cpu:1", "--worker-threads", "1"]
        if args.vllm:
            from tests.model_factory import build_llama_dir

            model = "small-llama"
            directory = build_llama_dir(Path(scratch) / model)
            arguments = ["--model", f"{model}={directory}", "--sampler", "vllm", *arguments]
            python = os.environ.get("CORTEX_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
            options = {"python": python, "timeout_s": 300}
        backend = start_backend(Path(scratch) / "backend", *arguments, **options)
        try:
            with Client(backend.url, backend.token) as client:
                sampler = client.create_sampler(model)
                sampler.generate([[1, 2, 3]], **params).result()  # warm up
                firsts, wholes, plains = [], [], []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    first = None
                    stream = sampler.generate_stream([[1, 2, 3]], **params)
                    for _piece in stream:
                        if first is None:
                            first = time.perf_counter() - started
                    wholes.append(time.perf_counter() - started)
                    firsts.append(first)
                    started = time.perf_counter()
                    sampler.generate([[1, 2, 3]], **params).result()
                    plains.append(time.perf_counter() - started)
                sampler.cancel()
        finally:
            backend.stop()
    first, whole, plain = (statistics.median(values) for values in (firsts, wholes, plains))
    print(
        f"{'vLLM' if args.vllm else 'built-in'} engine, {args.max_tokens} tokens, median of {args.repeats}:"
    )
    print(f"  first streamed token   {first * 1000:8.1f} ms")
    print(f"  whole streamed call    {whole * 1000:8.1f} ms")
    print(f"  whole unstreamed call  {plain * 1000:8.1f} ms")
    print(f"  first token / whole streamed call: {first / whole:.3f}")
    print(f"  streamed / unstreamed call:        {whole / plain:.2f}")


if __name__ == "__main__":
    main()
