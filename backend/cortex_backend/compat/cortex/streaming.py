"""POST /{job_id}/generate-stream: the SDK's polling-based streaming generate, on our streamed generate.

The body is the generate request as UTF-8 JSON. The answer is `{request_id, job_id, count}` at once; the
SDK then polls the request, and each poll drains up to `max_events` events (destructively, as the SDK
expects): `{"type": "tokens", "index", "sample_index", "token_ids", "logprobs", "text"}` as tokens are
decoded, `{"type": "result", "index", "result": {text, token_ids, finish_reason, ...}}` per sample once
its request ended, `{"type": "error", "index", "error"}` per sample of a failed one, and a last
`{"type": "done", "completed", "failed"}`. The poll's status and result are those of a plain generate.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from ...token_streams import TokenStreams
from . import batches
from .base import FRAME_BODY_LIMIT, CortexHandler
from .data_plane import submitted
from .sampling import generate_requests


@dataclass
class StreamFeed:
    """One SDK streaming request: its parts (our request id, first prompt index, prompt count), the events
    not yet drained, and the parts whose end was already turned into events."""

    parts: list[tuple[str, int, int]]
    events: deque = field(default_factory=deque)
    ended: set[str] = field(default_factory=set)
    completed: int = 0
    failed: int = 0
    done: bool = False

    def collect(self, token_streams: TokenStreams, views: dict[str, dict[str, Any]]) -> None:
        """Move the parts' news into events: tokens first, then the end of each part that has ended."""
        for request_id, first, count in self.parts:
            for piece in token_streams.take(request_id):
                self.events.extend(_tokens_event(sample, first) for sample in piece)
            view = views[request_id]
            if view["status"] not in states.REQUEST_TERMINAL or request_id in self.ended:
                continue
            self.ended.add(request_id)
            token_streams.close(request_id)
            if view["status"] == states.REQUEST_SUCCEEDED:
                for result in batches.generate_results(view["result"] or {}, first):
                    self.events.append({"type": "result", "index": result["prompt_index"], "result": result})
                    self.completed += 1
            else:
                error = view.get("error") or {}
                message = f"{error.get('code', view['status'])}: {error.get('message', '')}"
                for index in range(first, first + count):
                    self.events.append({"type": "error", "index": index, "error": message})
                    self.failed += 1
        if len(self.ended) == len(self.parts) and not self.done:
            self.events.append({"type": "done", "completed": self.completed, "failed": self.failed})
            self.done = True

    def drain(self, limit: int) -> list[dict[str, Any]]:
        return [self.events.popleft() for _ in range(min(limit, len(self.events)))]


def _tokens_event(sample: dict[str, Any], first: int) -> dict[str, Any]:
    return {
        "type": "tokens",
        "index": first + sample["prompt_index"],
        "sample_index": sample["sample_index"],
        "token_ids": sample["tokens"],
        "logprobs": sample["logprobs"],
        "text": sample["text"],
    }


class GenerateStreamHandler(CortexHandler):
    def body_limit(self) -> int:
        return FRAME_BODY_LIMIT

    def post(self, database: str, schema: str, job_id: str) -> None:
        try:
            value = json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError("invalid_field", f"the generate-stream body must be UTF-8 JSON: {exc}") from None
        parts, count = [], 0
        for prompts, params, first in generate_requests(value):
            body = {"prompts": prompts, "sampling_params": params, "stream": True}
            request = self.service.requests.submit(self.principal, job_id, "generate", b"", body, None)
            # Opened before the IO loop can read the worker's first tokens.
            self.service.token_streams.open(request["id"])
            parts.append((request["id"], first, len(prompts)))
            count += len(prompts) * int(params.get("n") or 1)
        answer = submitted(job_id, [request_id for request_id, _, _ in parts])
        self.face.streams[answer["request_id"]] = StreamFeed(parts)
        self.write_json({**answer, "count": count}, 202)


async def stream_events(
    handler: CortexHandler, job_id: str, request_id: str, hold_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """A poll of a streaming request: the parts as polled and the events drained (waiting up to `hold_s`
    for the first news); None for a request that is not a stream."""
    feed = handler.face.streams.get(request_id)
    if feed is None:
        return None
    requests, token_streams = handler.service.requests, handler.service.token_streams
    parts = [part for part, _, _ in feed.parts]
    while True:
        views = [await requests.get(handler.principal, job_id, part, 0, 0, 0.0) for part in parts]
        feed.collect(token_streams, dict(zip(parts, views, strict=True)))
        if feed.events or hold_s <= 0:
            break
        handler.waited = True
        pending = next(part for part in parts if part not in feed.ended)
        started = time.monotonic()
        await token_streams.news(pending, requests.waiters, hold_s)
        hold_s -= time.monotonic() - started
    events = feed.drain(handler._max_events())
    if feed.done and not feed.events:
        del handler.face.streams[request_id]
    return views, events
