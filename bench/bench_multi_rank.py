"""A training sub-job across ranks (FSDP2 over gloo on CPU) against the same sub-job in one process, as ratios
measured in one run.

    python bench/bench_multi_rank.py [--steps 5] [--hidden 768 --layers 8] [--threads 1]

A Llama-shaped model with random weights (default ~80M parameters) gets LoRA r=16 on every linear layer and
is trained the way a worker trains it (engine/trainer.py: forward_backward on a 4 x 128 batch, then an
AdamW step), once as one process and once as two ranks (engine/sharding.py: fully_shard per block, then the
root), each rank a process of its own with `--threads` threads. Per rank: the base's bytes it holds, its
resident memory after loading and sharding (RSS), its peak RSS while training, the datums of the batch it
computed, and the median step time after a warm-up. Each rank computes its slice of the batch
(engine/data_parallel.py: 2 of the 4 datums), so two ranks do half the compute each plus the all-gathers and
reduce-scatters; with `--threads` per rank, two ranks use twice the cores one process does.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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

from bench_bigger_bases import build_model_dir  # noqa: E402


def measure_rank(model_dir: str, steps: int, threads: int) -> dict:
    """One rank (or the only process): load, shard when WORLD_SIZE > 1, train `steps` + 1 steps."""
    import logging
    import resource

    import numpy as np
    import psutil
    import torch

    logging.disable(logging.WARNING)
    torch.set_num_threads(threads)
    from cortex_backend.engine import sharding
    from cortex_backend.engine.loading import pick_device
    from cortex_backend.engine.model_state import ModelState
    from cortex_backend.engine.trainer import Trainer
    from cortex_backend.models import ModelInfo

    if sharding.is_sharded():
        sharding.start_process_group(pick_device())
    config = json.loads((Path(model_dir) / "config.json").read_text())
    state = ModelState(ModelInfo("llama-random", "local", Path(model_dir), config), {"lora": {"r": 16}})
    if sharding.is_sharded():
        sharding.shard(state.model, state.device)
    trainer = Trainer(state, {"lr": 1e-4})
    rss = psutil.Process().memory_info().rss
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config["vocab_size"], (4, 129))
    batch = {
        "input_ids": ids[:, :-1],
        "target_tokens": ids[:, 1:],
        "weights": np.ones((4, 128), np.float32),
    }
    times, losses, datums = [], [], len(ids)
    for step in range(steps + 1):
        started = time.perf_counter()
        result, _ = trainer.forward_backward(batch, "cross_entropy", {})
        if "ranks" in result:
            datums = result["ranks"][sharding.rank()]["datums"]
        trainer.step()
        losses.append(result["loss"])
        if step:
            times.append(time.perf_counter() - started)
    return {
        "rank": sharding.rank(),
        "base_bytes": state.describe()["base_bytes"],
        "rss_bytes": rss,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "step_s": statistics.median(times),
        "losses": losses,
        "datums": datums,
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(world_size: int, model_dir: str, steps: int, threads: int) -> list[dict]:
    """`world_size` processes in one process group, as the local executor starts a sub-job's ranks."""
    port = str(free_port())
    processes = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "PYTHONWARNINGS": "ignore",
        }
        command = [sys.executable, __file__, "--steps", str(steps), "--threads", str(threads)]
        processes.append(
            subprocess.Popen(
                [*command, "--measure", model_dir],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    rows = []
    for process in processes:
        output, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"a rank failed (exit code {process.returncode})")
        rows.append(json.loads(output.strip().splitlines()[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_rank(args.measure, args.steps, args.threads)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = str(build_model_dir(Path(scratch) / "llama", args.hidden, args.layers))
        # One process before and after the ranks: the host is shared, so the spread between the two says how
        # much of a ratio is noise; the ratios use the faster of the two.
        before = run_ranks(1, model_dir, args.steps, args.threads)[0]
        two = run_ranks(2, model_dir, args.steps, args.threads)
        after = run_ranks(1, model_dir, args.steps, args.threads)[0]
    one = min(before, after, key=lambda row: row["step_s"])
    print(
        f"1 rank, step time before / after the 2-rank run: {before['step_s']:.3f} s / {after['step_s']:.3f} s"
    )
    print(
        f"1 rank: base {one['base_bytes'] / 2**20:.1f} MiB, RSS {one['rss_bytes'] / 2**20:.0f} MiB,"
        f" peak RSS {one['peak_rss_bytes'] / 2**20:.0f} MiB, step {one['step_s']:.3f} s"
    )
    for row in two:
        print(
            f"2 ranks, rank {row['rank']}: base bytes {row['base_bytes'] / one['base_bytes']:.3f}x,"
            f" RSS {row['rss_bytes'] / one['rss_bytes']:.3f}x,"
            f" peak RSS {row['peak_rss_bytes'] / one['peak_rss_bytes']:.3f}x,"
            f" step time {row['step_s'] / one['step_s']:.3f}x, computed {row['datums']} of {one['datums']} datums"
        )
    gap = max(abs(a - b) for a, b in zip(one["losses"], two[0]["losses"], strict=True))
    print(f"largest loss difference, 2 ranks vs 1, over {len(one['losses'])} steps: {gap:.2e}")


if __name__ == "__main__":
    main()
