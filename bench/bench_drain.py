"""What a backend stop costs running work: time from SIGTERM to exit with N training runs training, and
the steps each run lost per restart (SIGTERM: a drained stop; kill -9: a crash).

    python bench/bench_drain.py [--runs 4] [--steps 400] [--save-every 10] [--drain-grace 60]

Starts a real backend (`--devices cpu:N`) on one data dir and port, starts N training runs of the tiny
model, waits until each has trained a few steps, then:
1. SIGTERM: seconds until the process exits; the backend again on the same data dir; each run's
   `progress.resumed.lost_steps` (the goal is 0).
2. kill -9 once they train again: each run's lost steps (bounded by `save.every`).
Then every run is waited for to the end, and its step count checked against its total.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))


def main() -> None:
    from cortex_nb import Client
    from cortex_nb.demo_data import addition_problems
    from tests.backend_process import start_backend

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--drain-grace", type=float, default=60.0)
    args = parser.parse_args()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data_dir = Path(tempfile.mkdtemp(prefix="cortex-drain-"))
    serve_args = (
        "--devices",
        f"cpu:{args.runs}",
        "--port",
        str(port),
        "--drain-grace",
        str(args.drain_grace),
    )
    spec = {
        "base_model": "tiny",
        "data": addition_problems(),
        "steps": args.steps,
        "batch_size": 8,
        "max_seq_len": 16,
        "save": {"every": args.save_every},
    }

    def wait_training(jobs, at_least: int) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            steps = [(job.refresh().get("progress") or {}).get("step", 0) for job in jobs]
            if all(step >= at_least for step in steps) and all(
                job.info["status"] == "running" for job in jobs
            ):
                return
            time.sleep(0.5)
        raise RuntimeError(f"runs did not reach step {at_least}: {steps}")

    backend = start_backend(data_dir, *serve_args)
    client = Client(backend.url, backend.token, reconnect_s=600)
    try:
        jobs = [client.train(spec, name=f"drain-{index}") for index in range(args.runs)]
        wait_training(jobs, 3)

        started = time.monotonic()
        backend.process.send_signal(signal.SIGTERM)
        backend.process.wait(args.drain_grace + 60)
        drain_s = time.monotonic() - started
        backend = start_backend(data_dir, *serve_args)
        wait_training(jobs, 1)
        drained = [job.refresh()["progress"]["resumed"] for job in jobs]

        target = max(note["step"] for note in drained) + args.save_every + 3
        wait_training(jobs, target)
        backend.kill()
        backend = start_backend(data_dir, *serve_args)
        wait_training(jobs, 1)
        crashed = [job.refresh()["progress"]["resumed"] for job in jobs]

        finished = [job.wait(timeout_s=3600) for job in jobs]
    finally:
        client.close()
        backend.stop()

    print(
        f"runs: {args.runs} training runs of {args.steps} steps on tiny (cpu:{args.runs}), save.every {args.save_every}"
    )
    print(f"SIGTERM -> exit: {drain_s:.2f} s (drain grace {args.drain_grace:.0f} s)")
    print(f"steps lost per run, SIGTERM: {[note['lost_steps'] for note in drained]}")
    print(f"steps lost per run, kill -9: {[note['lost_steps'] for note in crashed]}")
    complete = [job["progress"]["step"] == job["progress"]["total_steps"] == args.steps for job in finished]
    print(f"runs completed with all their steps: {sum(complete)}/{len(complete)}")


if __name__ == "__main__":
    main()
