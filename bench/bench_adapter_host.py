"""Adapter host vs a process per sub-job: memory and aggregate training speed, as ratios within one run.

    python bench/bench_adapter_host.py [--slots 1,2,4,8] [--rounds N]

Two backends on this machine, one with `--adapter-host`, one with `--isolation-per-job` (no warm spares, so
each tree is the backend and what serves its jobs). For N = 1, 2, 4, 8 training jobs of the tiny model
(each after one forward_backward + step, so its optimizer state exists):
- PSS of each backend's process tree, over the same tree with one job (PSS: a shared page counts once);
- the bytes the host reports per slot against the growth measured;
- aggregate steps/s of N jobs stepping at once (each round: every job's forward_backward then step,
  pipelined), adapter host over N separate processes.

Figures of one run (shared 2-core machine, one torch thread per worker), in docs/api.md ("Adapter host").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def tree_pss_bytes(pid: int) -> int:
    total = 0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:"))
    return total


def batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(4, 65))
    return {
        "input_ids": tokens[:, :-1],
        "target_tokens": tokens[:, 1:],
        "weights": np.ones((4, 64), np.float32),
    }


def train_round(jobs: list) -> None:
    pending = [job.forward_backward(batch(index)) for index, job in enumerate(jobs)]
    steps = [job.step() for job in jobs]
    for future in pending + steps:
        future.result()


def measure(client: Client, pid: int, counts: list[int], rounds: int) -> dict[int, tuple[int, float, int]]:
    """count -> (tree PSS bytes, aggregate steps/s, bytes the slots report)."""
    jobs: list = []
    figures = {}
    try:
        for count in counts:
            while len(jobs) < count:
                jobs.append(client.create_training_job("tiny", lora={"r": 16, "alpha": 32}, seed=len(jobs)))
            train_round(jobs)  # every job has its optimizer state
            pss = tree_pss_bytes(pid)
            started = time.perf_counter()
            for _ in range(rounds):
                train_round(jobs)
            speed = rounds * len(jobs) / (time.perf_counter() - started)
            reported = sum(
                int((client.get_job(job.job_id)["sub_jobs"][0].get("info") or {}).get("slot_bytes") or 0)
                for job in jobs
            )
            figures[count] = (pss, speed, reported)
    finally:
        for job in jobs:
            job.cancel()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    counts = [int(n) for n in args.slots.split(",")]
    common = ("--devices", f"cpu:{max(counts)}", "--worker-threads", "1", "--warm-workers", "0")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("--adapter-host", "--isolation-per-job"):
            backend = start_backend(Path(tmp) / mode.strip("-"), *common, mode)
            try:
                with Client(backend.url, backend.token) as client:
                    results[mode] = measure(client, backend.pid, counts, args.rounds)
            finally:
                backend.stop()
    host, alone = results["--adapter-host"], results["--isolation-per-job"]
    one_host, one_alone = host[counts[0]][0], alone[counts[0]][0]
    print(
        f"{'N':>3} {'host PSS MiB':>13} {'/ N=1':>7} {'per-job PSS MiB':>16} {'/ N=1':>7} {'host/per-job':>13}"
        f" {'slot MiB rep.':>14} {'growth MiB':>11} {'steps/s host/per-job':>21}"
    )
    for count in counts:
        pss, speed, reported = host[count]
        pss_alone, speed_alone, _ = alone[count]
        print(
            f"{count:>3} {pss / 2**20:>13.0f} {pss / one_host:>7.2f} {pss_alone / 2**20:>16.0f}"
            f" {pss_alone / one_alone:>7.2f} {pss / pss_alone:>13.2f} {reported / 2**20:>14.1f}"
            f" {(pss - one_host) / 2**20:>11.0f} {speed / speed_alone:>21.2f}"
        )


if __name__ == "__main__":
    main()
