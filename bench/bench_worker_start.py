"""Forked CPU workers against workers started as processes: how long a job waits for its worker, and the
memory N workers hold, as ratios within one run.

    python bench/bench_worker_start.py [--jobs 4] [--rounds 3]

Two backends on this machine, `--worker-start fork` (the default) and `--worker-start exec`, each with no
warm spare (`--warm-workers 0`), so every job waits for its worker to start. Each round creates `--jobs`
tiny training jobs one after another on each backend (the two interleaved) and times each creation to
ready; then, with the jobs alive and each one step in, the PSS of each backend's process tree (a page shared
between the forks counts once). Figures of one run are in docs/api.md ("How workers start").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_adapter_host import batch, tree_pss_bytes  # noqa: E402
from cortex_nb import Client  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    common = ("--devices", f"cpu:{args.jobs}", "--warm-workers", "0", "--worker-threads", "1")
    with tempfile.TemporaryDirectory() as scratch:
        backends = {
            mode: start_backend(Path(scratch) / mode, *common, "--worker-start", mode)
            for mode in ("fork", "exec")
        }
        clients = {mode: Client(backend.url, backend.token) for mode, backend in backends.items()}
        starts: dict[str, list[float]] = {mode: [] for mode in backends}
        pss: dict[str, list[int]] = {mode: [] for mode in backends}
        try:
            for _ in range(args.rounds):
                jobs: dict[str, list] = {mode: [] for mode in backends}
                for index in range(args.jobs):
                    for mode, client in clients.items():
                        started = time.perf_counter()
                        jobs[mode].append(client.create_training_job("tiny", seed=index))
                        starts[mode].append(time.perf_counter() - started)
                for mode, made in jobs.items():
                    for index, job in enumerate(made):
                        job.forward_backward(batch(index)).result()
                        job.step().result()
                    pss[mode].append(tree_pss_bytes(backends[mode].pid))
                    for job in made:
                        job.cancel()
                time.sleep(2)  # the cancelled jobs' workers exit before the next round
        finally:
            for backend in backends.values():
                backend.stop()
    fork_start, exec_start = statistics.median(starts["fork"]), statistics.median(starts["exec"])
    fork_pss, exec_pss = statistics.median(pss["fork"]), statistics.median(pss["exec"])
    print(
        f"job created to ready, median of {len(starts['fork'])}: fork {fork_start:.2f} s, exec {exec_start:.2f} s,"
    )
    print(f"  fork / exec = {fork_start / exec_start:.3f}")
    print(f"backend tree PSS with {args.jobs} jobs one step in, median of {args.rounds}:")
    print(
        f"  fork {fork_pss / 2**20:.0f} MiB, exec {exec_pss / 2**20:.0f} MiB, fork / exec = {fork_pss / exec_pss:.3f}"
    )


if __name__ == "__main__":
    main()
