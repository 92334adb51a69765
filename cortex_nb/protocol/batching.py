"""Build forward_backward / forward batches from token sequences (next-token targets, masks, padding)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .losses import wire_dtype


def next_token_batch(
    sequences: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int] | None = None,
    pad_id: int = 0,
    max_len: int | None = None,
) -> dict[str, np.ndarray]:
    """A `cross_entropy` batch: position t predicts token t+1.

    With `prompt_lengths`, only completion tokens carry weight (loss on the completion only).
    Padding has weight 0 and attention 0. Sequences longer than `max_len` + 1 are cut.
    """
    if not sequences:
        raise ValueError("give at least one sequence")
    cut = [list(seq[: (max_len + 1) if max_len else None]) for seq in sequences]
    if min(len(seq) for seq in cut) < 2:
        raise ValueError("each sequence needs at least 2 tokens (an input and a target)")
    width = max(len(seq) for seq in cut) - 1
    batch = len(cut)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)
    target_tokens = np.full((batch, width), pad_id, dtype=np.int64)
    weights = np.zeros((batch, width), dtype=np.float32)
    attention = np.zeros((batch, width), dtype=np.int64)
    for i, seq in enumerate(cut):
        n = len(seq) - 1
        input_ids[i, :n] = seq[:-1]
        target_tokens[i, :n] = seq[1:]
        attention[i, :n] = 1
        first_weighted = max((prompt_lengths[i] if prompt_lengths is not None else 1) - 1, 0)
        weights[i, first_weighted:n] = 1.0
    return {
        "input_ids": input_ids,
        "target_tokens": target_tokens,
        "weights": weights,
        "attention_mask": attention,
    }


def pack_sequences(
    token_lists: Sequence[Sequence[int]], seq_len: int, weight_lists: Sequence[Sequence[float]] | None = None
) -> list[tuple[list[int], list[float]]]:
    """Concatenate documents and cut them into rows of `seq_len + 1` tokens (no padding wasted).

    Returns (tokens, weights) rows; weights say which target tokens count (e.g. completions only).
    """
    stream: list[int] = []
    stream_weights: list[float] = []
    for index, tokens in enumerate(token_lists):
        stream.extend(tokens)
        stream_weights.extend(weight_lists[index] if weight_lists is not None else [1.0] * len(tokens))
    rows = []
    step = seq_len + 1
    for start in range(0, max(len(stream) - 1, 0), seq_len):
        tokens = stream[start : start + step]
        if len(tokens) < 2:
            break
        rows.append((tokens, stream_weights[start : start + step]))
    return rows


def rows_to_batch(rows: Sequence[tuple[list[int], list[float]]], pad_id: int = 0) -> dict[str, np.ndarray]:
    """Packed (tokens, weights) rows -> a cross_entropy batch; the weight of token t+1 goes on position t."""
    width = max(len(tokens) for tokens, _ in rows) - 1
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    target_tokens = np.full((len(rows), width), pad_id, dtype=np.int64)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    for i, (tokens, token_weights) in enumerate(rows):
        n = len(tokens) - 1
        input_ids[i, :n] = tokens[:-1]
        target_tokens[i, :n] = tokens[1:]
        weights[i, :n] = token_weights[1:]
        attention[i, :n] = 1
    return {
        "input_ids": input_ids,
        "target_tokens": target_tokens,
        "weights": weights,
        "attention_mask": attention,
    }


def as_batch(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Lists or arrays -> numpy with the dtypes the losses' tensor specs name (ids int64, the rest float32)."""
    return {name: np.asarray(value).astype(wire_dtype(name)) for name, value in batch.items()}
