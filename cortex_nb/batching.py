"""Batches from token sequences, under the SDK name notebooks use: `cortex_nb.protocol.batching`."""

from __future__ import annotations

from .protocol.batching import as_batch, next_token_batch, pack_sequences, rows_to_batch  # noqa: F401
