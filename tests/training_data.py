"""Deterministic training batches and helpers shared by the checkpoint and weight-sync tests."""

from __future__ import annotations

import numpy as np

TEXT = b"the sampler must see what the trainer learned. "


def random_batches(
    count: int, vocab: int, rows: int = 2, length: int = 16, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """`count` cross-entropy batches of random token ids (the same every run)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        ids = rng.integers(0, vocab, (rows, length))
        targets = np.roll(ids, -1, axis=1)
        batches.append(
            {"input_ids": ids, "target_tokens": targets, "weights": np.ones((rows, length), np.float32)}
        )
    return batches


def text_batch(repeats: int = 3) -> dict[str, np.ndarray]:
    """One batch teaching the byte-level `tiny` model to continue TEXT: trains greedy output fast."""
    ids = np.frombuffer(TEXT * repeats, dtype=np.uint8).astype(np.int64)[None, :]
    return {
        "input_ids": ids[:, :-1],
        "target_tokens": ids[:, 1:],
        "weights": np.ones((1, ids.shape[1] - 1), np.float32),
    }


def train(job, batches, learning_rate: float | None = None) -> list[float]:
    """forward_backward + step per batch, queued without waiting; returns the losses in order."""
    pairs = [(job.forward_backward(batch), job.step(learning_rate)) for batch in batches]
    losses = []
    for forward_backward, step in pairs:
        losses.append(forward_backward.result()["loss"])
        step.result()
    return losses
