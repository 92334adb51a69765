"""What preemption and a training run's retry cost: on one CPU slot (`--preempt-below 5`), the seconds a
priority-9 sampler waits for the slot a priority-2 training run holds (the run pauses at a checkpoint and is
queued again), as a ratio to the seconds the same sampler takes to start on an idle slot; the steps the
preempted run lost (the goal is 0). Then a run with `retry` whose worker is killed: seconds from the kill to
training again, as a ratio to the run's own first start, and the steps it lost (bounded by `save.every`).

    python bench/bench_preemption.py [--steps 200] [--save-every 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backend"))

SAMPLER = [{"type": "sampling", "base_model": "tiny"}]


def main() -> None:
    from cortex_nb import Client
    from cortex_nb.demo_data import addition_problems
    from tests.backend_process import start_backend

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    spec = {
        "base_model": "tiny",
        "data": addition_problems(),
        "steps": args.steps,
        "batch_size": 8,
        "max_seq_len": 16,
        "save": {"every": args.save_every},
    }

    def until(predicate, timeout_s: float = 600.0) -> float:
        started = time.monotonic()
        while not predicate():
            if time.monotonic() - started > timeout_s:
                raise RuntimeError("timed out")
            time.sleep(0.05)
        return time.monotonic() - started

    backend = start_backend(
        Path(tempfile.mkdtemp(prefix="cortex-preempt-")), "--devices", "cpu:1", "--preempt-below", "5"
    )
    client = Client(backend.url, backend.token)
    try:
        status = lambda job_id: client.get_job(job_id)["status"]  # noqa: E731
        idle = client.create_job(SAMPLER, name="idle-start", priority=9)
        idle_s = until(lambda: status(idle["job_id"]) == "running")
        client.cancel_job(idle["job_id"])

        low = client.train(spec, name="low", priority=2)
        until(lambda: (low.progress or {}).get("step", 0) >= 5)
        high = client.create_job(SAMPLER, name="high", priority=9)
        preempt_s = until(lambda: status(high["job_id"]) == "running")
        client.cancel_job(high["job_id"])
        preempted = low.wait(timeout_s=1800)

        run = client.train({**spec, "retry": {"max": 1, "backoff_s": 0}}, name="retried")
        first_start_s = until(lambda: (run.progress or {}).get("step", 0) >= 1)
        until(lambda: ((run.progress or {}).get("last_checkpoint_step") or 0) >= args.save_every)
        pid = client.get_job(run.job_id)["sub_jobs"][0]["info"]["pid"]
        os.kill(pid, signal.SIGKILL)
        back_s = until(lambda: bool((run.refresh().get("progress") or {}).get("resumed")))
        back_s += until(lambda: run.refresh()["progress"]["step"] > run.progress["resumed"]["step"])
        retried = run.wait(timeout_s=1800)
    finally:
        client.close()
        backend.stop()

    resumed = preempted["progress"]["resumed"]
    print(f"one CPU slot, tiny model, {args.steps}-step training runs, save.every {args.save_every}")
    print(
        f"priority-9 sampler start: idle slot {idle_s:.2f} s; behind a preempted run {preempt_s:.2f} s"
        f" (ratio {preempt_s / idle_s:.2f})"
    )
    print(
        f"preempted run: paused at step {resumed['step']}, lost {resumed['lost_steps']} steps,"
        f" finished {preempted['progress']['step']}/{preempted['progress']['total_steps']}"
    )
    retry_note = retried["progress"]["resumed"]
    print(
        f"killed worker -> training again: {back_s:.2f} s (first start {first_start_s:.2f} s, ratio"
        f" {back_s / first_start_s:.2f}); lost {retry_note['lost_steps']} steps; finished"
        f" {retried['progress']['step']}/{retried['progress']['total_steps']} ({retried['status']})"
    )


if __name__ == "__main__":
    main()
