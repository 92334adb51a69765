"""What one adapter-host slot really adds to its process, against the bytes it reports.

    python bench/bench_slot_bytes.py [--slots 6] [--rank 16] [--model tiny|HIDDEN:LAYERS]

In one process, as an adapter host builds them: one base (adapter_host.BaseModels), then N training slots,
each a module tree over the shared base with its own LoRA adapter and AdamW trainer, each taken through
one forward_backward and step. For each slot: the process's unique memory (USS) grown by building it and by
its first step, against what the slot reports (`slot_bytes`: adapter, gradients, two AdamW moments, 4x the
adapter). The first slot also pays the process's one-time costs (the allocator's first activations, lazy
imports); the rows after it are what each further slot adds. Single-threaded torch, so thread pools do not
blur the figures.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backend")]

MIB = 2**20


def unique_bytes() -> int:
    gc.collect()
    return psutil.Process().memory_full_info().uss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--model", default="tiny", help="tiny, or HIDDEN:LAYERS for a random base of that size"
    )
    args = parser.parse_args()

    import torch
    from cortex_backend.models import ModelCatalog

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "tiny":
            info = ModelCatalog({}).get("tiny")
        else:
            from bench_bigger_bases import build_model_dir

            hidden, layers = (int(part) for part in args.model.split(":"))
            info = ModelCatalog({"llama-random": build_model_dir(Path(tmp) / "llama", hidden, layers)}).get(
                "llama-random"
            )
        measure(info, args.slots, args.rank)


def measure(info, count: int, rank: int) -> None:
    from cortex_backend.adapter_host import BaseModels
    from cortex_backend.engine.model_state import ModelState, adapter_bytes
    from cortex_backend.engine.trainer import Trainer

    bases = BaseModels()
    bases.share(info)
    print(f"base {info.name}: {bases.base_bytes() / MIB:.1f} MiB; LoRA r{rank}")
    print(f"{'slot':>4} {'built':>9} {'1st step':>9} {'total':>9} {'reported':>9} {'unreported':>10}")
    rng = np.random.default_rng(0)
    slots, extra = [], []
    for index in range(count):
        before = unique_bytes()
        state = ModelState(
            info, {"lora": {"r": rank, "alpha": 2 * rank}, "seed": index}, base=bases.share(info)
        )
        trainer = Trainer(state, {"lr": 1e-3})
        built = unique_bytes()
        tokens = rng.integers(3, info.vocab_size, size=(2, 33))
        batch = {
            "input_ids": tokens[:, :-1],
            "target_tokens": tokens[:, 1:],
            "weights": np.ones((2, 32), np.float32),
        }
        trainer.forward_backward(batch, "cross_entropy", {})
        trainer.step()
        stepped = unique_bytes()
        reported = 4 * adapter_bytes(state.model)
        total = stepped - before
        if index:
            extra.append(total - reported)
        slots.append(trainer)
        print(
            f"{index:>4} {(built - before) / MIB:>8.2f}M {(stepped - built) / MIB:>8.2f}M {total / MIB:>8.2f}M"
            f" {reported / MIB:>8.2f}M {(total - reported) / MIB:>9.2f}M"
        )
    if extra:
        print(f"each slot after the first adds {np.mean(extra) / MIB:.2f} MiB more than it reports (mean)")


if __name__ == "__main__":
    main()
