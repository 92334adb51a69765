"""The managed training loop's speed, as ratios against a baseline measured in the same run.

    python bench/bench_train_loop.py [--steps N] [--batch-size B] [--seq-len L]

- baseline: the same steps driven from this process through the primitive API, pipelined (the next
  step queued before the last result is read), on the same batches (`cortex_nb.train_data`);
- a training run (`Client.train`): the loop in the training worker, no round trip per step;
- the training run with a live widget following it (feed thread + throttled renders).

Each trains `tiny` on the shipped demo text on a fresh job; model start-up is not timed (a managed
run's time is its progress record's `elapsed_s`, from its first step to its last).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from cortex_nb.batching import rows_to_batch  # noqa: E402
from cortex_nb.train_data import load_examples, tokenize_and_pack  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "cortex_nb" / "data" / "demo.txt"
LORA, OPTIMIZER = {"r": 16, "alpha": 32}, {"lr": 3e-3}


def client_loop(client: Client, steps: int, batch_size: int, seq_len: int) -> float:
    """Seconds per step of a pipelined loop in this process, from its first step to its last."""
    data = tokenize_and_pack(client, "tiny", load_examples(str(DEMO), {}), seq_len)
    batches = data.batches(batch_size, 0)
    job = client.create_training_job("tiny", lora=LORA, optimizer=OPTIMIZER)
    started = time.perf_counter()
    pending = None
    for _ in range(steps):
        queued = (job.forward_backward(rows_to_batch(next(batches), data.pad_id)), job.step())
        if pending is not None:
            pending[0].result(), pending[1].result()
        pending = queued
    pending[0].result(), pending[1].result()
    elapsed = time.perf_counter() - started
    job.cancel()
    return elapsed / steps


def managed_run(
    client: Client, steps: int, batch_size: int, seq_len: int, with_widget: bool
) -> tuple[float, int]:
    """Seconds per step of a training run, and the renders of a widget following it (if any)."""
    job = client.train(
        {
            "base_model": "tiny",
            "data": str(DEMO),
            "steps": steps,
            "batch_size": batch_size,
            "max_seq_len": seq_len,
            "lora": LORA,
            "optimizer": OPTIMIZER,
        }
    )
    widget = None
    if with_widget:
        from cortex_nb.job_state import JobState
        from cortex_nb.widgets.job_widget import JobWidget

        state = JobState(job.job_id)
        state.set_job(job.info)
        widget = JobWidget(client, state).follow()
    finished = job.wait()
    renders = 0
    if widget is not None:
        widget.feed.join(60)
        widget.throttle.flush()
        renders = widget.throttle.renders
        widget.close()
    assert finished["status"] == "done", finished
    progress = finished["progress"]
    # elapsed_s runs from the loop's first step; the first step's own time is in it, as in the baseline.
    return progress["elapsed_s"] / progress["step"], renders


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    shape = (args.steps, args.batch_size, args.seq_len)
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:4", "--worker-threads", "1")
        try:
            with Client(backend.url, backend.token) as client:
                managed_run(client, 5, args.batch_size, args.seq_len, False)  # warm the worker pool
                baseline = client_loop(client, *shape)
                managed, _ = managed_run(client, *shape, with_widget=False)
                watched, renders = managed_run(client, *shape, with_widget=True)
        finally:
            backend.stop()
    print(f"tiny, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, CPU")
    print(f"client-driven pipelined loop {baseline * 1000:7.1f} ms/step")
    print(
        f"training run                  {managed * 1000:7.1f} ms/step   x{baseline / managed:.2f} the client loop's speed"
    )
    print(
        f"training run + live widget    {watched * 1000:7.1f} ms/step   cost x{watched / managed:.2f} ({renders} renders)"
    )


if __name__ == "__main__":
    main()
