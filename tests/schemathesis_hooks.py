"""Schemathesis hooks for fuzzing the backend (tests/test_openapi_fuzz.py, bench/bench_openapi_fuzz.py).

Bodies that are not JSON (a tensor frame, a dataset's JSONL, a chunk) are sent as the bytes generated
for them, so the backend's own parsers meet them. Long-polls are kept short: a generated `wait` of 60 s
would spend the run's time budget waiting rather than testing, and a followed log stream lasts as long
as its job (both are tested on their own elsewhere).
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

MAX_WAIT_S = 0.2


@schemathesis.serializer(
    "application/vnd.cortex.frame+safetensors",
    "application/x-ndjson",
    "application/x-tar",
    "application/x-protobuf",
    "application/octet-stream",
)
def raw_bytes(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    if isinstance(query, dict):
        if "wait" in query:
            try:
                query["wait"] = min(float(query["wait"]), MAX_WAIT_S)
            except (TypeError, ValueError):
                pass  # a malformed wait stays: the backend must refuse it with a 400
        if "follow" in query:
            query["follow"] = "0"
    return query
