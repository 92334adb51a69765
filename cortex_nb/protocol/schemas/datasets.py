"""Datasets of training runs: JSONL rows uploaded once, named by their SHA-256."""

from __future__ import annotations

from .base import Reply


class DatasetView(Reply):
    dataset_id: str
    rows: int
    bytes: int
    created_at: float
