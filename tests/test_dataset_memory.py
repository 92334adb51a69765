"""Storing an uploaded dataset reads it line by line: checking its rows takes a small multiple of the body
in memory, not the whole text again plus a list of its lines as well."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import pytest
from cortex_backend.auth import Principal
from cortex_backend.datasets import DatasetStore
from cortex_backend.store import Store

from cortex_nb.protocol.errors import ApiError


def test_a_dataset_is_checked_without_copies_of_its_whole_text(tmp_path):
    body = "".join(
        json.dumps({"prompt": f"ünïcode question {i} " * 3, "completion": f"answer {i}"}, ensure_ascii=False)
        + "\n"
        for i in range(60_000)
    ).encode()
    datasets = DatasetStore(Store(tmp_path / "db.sqlite3"), tmp_path / "datasets")
    owner = Principal(token_id="t-1", owner="someone", scopes=frozenset({"jobs:write"}))
    tracemalloc.start()
    try:
        stored = datasets.put(owner, hashlib.sha256(body).hexdigest(), body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stored["rows"] == 60_000
    assert peak < 4 * len(body), f"{peak / len(body):.1f}x the body"
    # A line that is not UTF-8 is refused, and named.
    bad = b'{"text": "fine"}\n' + b'{"text": "\xff"}\n'
    with pytest.raises(ApiError) as caught:
        datasets.put(owner, hashlib.sha256(bad).hexdigest(), bad)
    assert caught.value.code == "invalid_dataset" and "UTF-8" in caught.value.message
