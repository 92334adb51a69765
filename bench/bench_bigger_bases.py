"""Bigger bases on one device: a quantized base (nf4, int8) and gradient checkpointing, against the same
base in full precision with a plain backward pass, as ratios measured in one run.

    python bench/bench_bigger_bases.py [--steps 5] [--hidden 768 --layers 8]

For `tiny` and for a Llama-shaped model built here with random weights (default ~80M parameters), each
precision is loaded in a fresh process the way a training worker loads it (base, then LoRA r=16 on every
linear layer) and measured there: the base's bytes as held (quantized tensors by their packed storage), the
process's resident memory after loading (RSS; one process per precision, so no sharing), and training
tokens/s (forward_backward + AdamW step on a 4 x 128 batch, median of `--steps` after a warm-up), and the
memory training added on top of the loaded model (peak RSS while training minus RSS after loading: mostly
activations, which gradient checkpointing trades for recomputation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def measure(
    model: str, model_dir: str | None, quantization: str | None, steps: int, checkpointing: bool
) -> dict:
    import logging
    import resource

    import psutil
    import torch

    logging.disable(logging.WARNING)
    from cortex_backend.engine.model_state import ModelState
    from cortex_backend.models import TINY, TINY_CONFIG, ModelInfo

    if model == TINY:
        info = ModelInfo(TINY, "builtin", None, dict(TINY_CONFIG), quantization)
    else:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        info = ModelInfo(model, "local", Path(model_dir), config, quantization)
    state = ModelState(info, {"lora": {"r": 16, "alpha": 32}, "seed": 0})
    if checkpointing:
        state.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    state.model.train()
    rss = psutil.Process().memory_info().rss
    parameters = [p for p in state.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    ids = torch.randint(0, info.vocab_size, (4, 128))
    times = []
    for step in range(steps + 1):
        started = time.perf_counter()
        loss = state.model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:
            times.append(time.perf_counter() - started)
    return {
        "base_bytes": state.describe()["base_bytes"],
        "rss_bytes": rss,
        "tokens_per_s": ids.numel() / statistics.median(times),
        "training_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss,
    }


def build_model_dir(path: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument(
        "--measure", nargs=4, metavar=("MODEL", "DIR", "QUANTIZATION", "GC"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.measure:
        model, model_dir, quantization, checkpointing = args.measure
        result = measure(
            model,
            None if model_dir == "-" else model_dir,
            None if quantization == "-" else quantization,
            args.steps,
            checkpointing == "gc",
        )
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as scratch:
        local = build_model_dir(Path(scratch) / "llama", args.hidden, args.layers)
        for model, model_dir in (("tiny", "-"), ("llama-random", str(local))):
            rows = {}
            for quantization in ("-", "int8", "nf4", "gc"):
                output = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--steps",
                        str(args.steps),
                        "--measure",
                        model,
                        model_dir,
                        "-" if quantization == "gc" else quantization,
                        "gc" if quantization == "gc" else "-",
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                rows[quantization] = json.loads(output.strip().splitlines()[-1])
            full = rows["-"]
            print(
                f"{model}: full precision base {full['base_bytes'] / 2**20:.1f} MiB, RSS {full['rss_bytes'] / 2**20:.0f} MiB,"
                f" {full['tokens_per_s']:.0f} tokens/s"
            )
            for quantization in ("int8", "nf4", "gc"):
                row = rows[quantization]
                label = "fp32 + gradient checkpointing" if quantization == "gc" else quantization
                print(
                    f"  {label}: base bytes {row['base_bytes'] / full['base_bytes']:.3f}x,"
                    f" RSS {row['rss_bytes'] / full['rss_bytes']:.3f}x,"
                    f" training memory {row['training_bytes'] / max(full['training_bytes'], 1):.3f}x,"
                    f" tokens/s {row['tokens_per_s'] / full['tokens_per_s']:.3f}x"
                )


if __name__ == "__main__":
    main()
