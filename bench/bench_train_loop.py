"""The %%cortex train loop's speed, as ratios against baselines measured in the same run.

    python bench/bench_train_loop.py [--steps N] [--batch-size B] [--seq-len L]

- pipelined loop (the next step queued before the last result is read) vs the same loop reading
  each step before queueing the next;
- the pipelined loop with a live widget following it (feed thread + throttled renders) vs without.

Each loop trains `tiny` on the shipped demo text on a fresh job; model start-up is not timed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cortex_nb import Client  # noqa: E402
from cortex_nb.train_data import load_examples, tokenize_and_pack  # noqa: E402
from cortex_nb.train_loop import TrainingRun  # noqa: E402
from cortex_nb.train_spec import TrainSpec  # noqa: E402
from tests.backend_process import start_backend  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "cortex_nb" / "data" / "demo.txt"


def timed_run(client: Client, spec: TrainSpec, data, depth: int, with_widget: bool) -> tuple[float, int]:
    """Seconds per step of one loop (from the first step to the last), and renders if a widget followed."""
    job = client.create_training_job("tiny", lora={"r": 16, "alpha": 32}, optimizer={"lr": 3e-3})
    run = TrainingRun(job, spec, data, pipeline_depth=depth)
    renders = 0
    widget = None
    if with_widget:
        from cortex_nb.widgets.job_widget import JobWidget

        widget = JobWidget(client, run.state, run).follow()
    run.start()
    run.wait()
    if widget is not None:
        widget.throttle.flush()
        renders = widget.throttle.renders
        widget.close()
        widget.feed.join(30)
    assert run.status == "done", run.state.summary()
    elapsed = run.state.snapshot().elapsed_s or 0.0
    job.cancel()
    return elapsed / spec.steps, renders


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        backend = start_backend(Path(data_dir), "--devices", "cpu:4", "--worker-threads", "1")
        try:
            with Client(backend.url, backend.token) as client:
                spec = TrainSpec(data=str(DEMO), steps=args.steps, batch_size=args.batch_size, max_seq_len=args.seq_len)
                data = tokenize_and_pack(client, "tiny", load_examples(str(DEMO), {}), args.seq_len)
                timed_run(client, TrainSpec(data=str(DEMO), steps=5), data, 1, False)  # warm the worker pool
                sequential, _ = timed_run(client, spec, data, 0, False)
                pipelined, _ = timed_run(client, spec, data, 1, False)
                watched, renders = timed_run(client, spec, data, 1, True)
        finally:
            backend.stop()
    print(f"tiny, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, CPU")
    print(f"sequential loop         {sequential * 1000:7.1f} ms/step")
    print(f"pipelined loop          {pipelined * 1000:7.1f} ms/step   speed-up x{sequential / pipelined:.2f}")
    print(f"pipelined + live widget {watched * 1000:7.1f} ms/step   cost x{watched / pipelined:.2f} ({renders} renders)")


if __name__ == "__main__":
    main()
