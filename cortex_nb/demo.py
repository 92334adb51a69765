"""`cortex-nb demo`: fine-tune the built-in `tiny` model with LoRA on a short text, on the embedded
backend, and show the loss falling and a greedy sample before and after.
"""

from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path

from .batching import pack_sequences, rows_to_batch
from .client import Client

PROMPT = "The lighthouse keeper"


def demo_text() -> str:
    return resources.files("cortex_nb").joinpath("data/demo.txt").read_text()


def run_demo(steps: int = 200, learning_rate: float = 3e-3, data_dir: str | Path | None = None, seq_len: int = 64) -> dict:
    started = time.monotonic()
    print("cortex-nb demo: LoRA fine-tuning of the built-in 'tiny' model (random weights, byte tokens) on CPU or GPU")
    client = Client.local(data_dir)
    print(f"backend: {client.url} (embedded), devices: {[d['name'] for d in client.get_capacity()['devices']]}")
    text = demo_text()
    with client.create_training_job("tiny", lora={"r": 16, "alpha": 32}, optimizer={"lr": learning_rate}, name="demo") as job:
        before = job.generate([PROMPT], max_tokens=96, temperature=0.0).result()
        tokens = client.tokenize("tiny", [text])[0]
        batch = rows_to_batch(pack_sequences([tokens], seq_len))
        targets = float(batch["weights"].sum())
        print(f"job {job.job_id}: {len(tokens)} tokens in {len(batch['input_ids'])} rows of {seq_len}; {steps} steps at lr {learning_rate}")
        print(f"greedy sample before: {before.texts[0]!r}")
        losses = []
        pending = (job.forward_backward(batch), job.step())
        for step in range(1, steps + 1):
            # Queue the next step before reading this one's result: the worker never waits for us.
            following = (job.forward_backward(batch), job.step()) if step < steps else None
            loss = pending[0].result()["loss"] / targets
            pending[1].result()
            losses.append(loss)
            if step == 1 or step % max(steps // 10, 1) == 0:
                print(f"  step {step:4d}  loss/token {loss:7.4f}  perplexity {math.exp(loss):8.2f}")
            pending = following
        after = job.generate([PROMPT], max_tokens=96, temperature=0.0).result()
        print(f"greedy sample after:  {after.texts[0]!r}")
    print(f"loss/token {losses[0]:.3f} -> {losses[-1]:.3f} in {time.monotonic() - started:.0f}s")
    return {"losses": losses, "before": before.texts[0], "after": after.texts[0], "job_id": job.job_id}
