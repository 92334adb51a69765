"""A forward_backward frame over 1 MiB is streamed to its worker in slices; a step sent right behind it must wait
for the last slice, not land inside the frame (the worker then read a corrupted batch: 'Target ... is out of
bounds'). Each pair below trains on the same batch, so the loss must fall."""

from __future__ import annotations

import numpy as np

from cortex_nb import Client, wire


def test_steps_queued_behind_streamed_frames_reach_the_worker_intact(client: Client):
    rng = np.random.default_rng(0)
    rows, width = 160, 255  # just over 1 MiB: 28 bytes a token
    batch = {
        "input_ids": rng.integers(0, 256, (rows, width)),
        "target_tokens": rng.integers(0, 256, (rows, width)),
        "weights": np.ones((rows, width), np.float32),
        "attention_mask": np.ones((rows, width), np.int64),
    }
    assert len(wire.encode_frame(batch, {"loss_fn": "cross_entropy"})) > 1 << 20
    job = client.create_training_job("tiny", lora={"r": 4}, optimizer={"lr": 1e-3})
    try:
        job.wait_ready()
        pairs = [
            (job.forward_backward(batch), job.step()) for _ in range(2)
        ]  # queued back to back, read afterwards
        losses = []
        for forward_backward, step in pairs:
            # Bounded: a corrupted stream can also leave the worker waiting for bytes that never come.
            losses.append(forward_backward.result(timeout_s=240)["metrics"]["loss:sum"])
            step.result(timeout_s=240)
        assert losses[0] > losses[1], losses
    finally:
        job.cancel()
