"""A forward_backward frame over 1 MiB is streamed to its worker in slices; a step sent right behind it must wait
for the last slice, not land inside the frame (the worker then read a corrupted batch: 'Target ... is out of
bounds'). Each pair below trains on the same batch, so the losses must fall step by step."""

from __future__ import annotations

import numpy as np

from cortex_nb import Client, wire


def test_steps_queued_behind_streamed_frames_reach_the_worker_intact(client: Client):
    rng = np.random.default_rng(0)
    rows, width = 256, 255
    batch = {"input_ids": rng.integers(0, 256, (rows, width)), "target_tokens": rng.integers(0, 256, (rows, width)),
             "weights": np.ones((rows, width), np.float32)}
    assert len(wire.encode_frame(batch, {"loss_fn": "cross_entropy"})) > 1 << 20
    job = client.create_training_job("tiny", lora={"r": 4}, optimizer={"lr": 1e-3})
    try:
        job.wait_ready()
        pairs = [(job.forward_backward(batch), job.step()) for _ in range(3)]  # queued back to back, read afterwards
        losses = []
        for forward_backward, step in pairs:
            losses.append(forward_backward.result()["metrics"]["loss:sum"])
            step.result()
        assert losses[0] > losses[1] > losses[2], losses
    finally:
        job.cancel()
