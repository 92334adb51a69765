"""A streamed generate (`stream: true`): the reply is server-sent events instead of a request id to poll.

Events, in order: `submitted` (the request id, as the plain reply gives it), `tokens` as they are decoded
({"samples": [{prompt_index, sample_index, tokens, logprobs, text}]}, only the rows with news), and a
last `result`: the request as a poll answers it once it has ended (its `result` is the non-streamed
one). A comment line every HEARTBEAT_S of quiet keeps proxies from closing the connection. A client
that disconnects cancels the request, so the sampler is free for the next one at once.
"""

from __future__ import annotations

from typing import Any

from tornado.iostream import StreamClosedError

from cortex_nb.protocol import states

from ..data_plane import public_request
from ..validation import dumps_strict
from .base import BaseHandler

HEARTBEAT_S = 10.0
MEDIA_TYPE = "text/event-stream"


def event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {dumps_strict(data)}\n\n"


class GenerateStream:
    """Sends one streamed generate's events through `handler`; `closed` is set when the client leaves."""

    def __init__(self, handler: BaseHandler, request: dict[str, Any], submitted: dict[str, Any]) -> None:
        self.handler, self.request, self.submitted = handler, request, submitted
        self.closed = False
        # Opened before the first await: no token the worker reports can arrive before it.
        handler.service.token_streams.open(request["id"])

    def client_left(self) -> None:
        self.closed = True
        self.handler.service.token_streams.waiters.notify(self.request["id"])

    async def send(self) -> None:
        handler, service = self.handler, self.handler.service
        request_id, job_id = self.request["id"], self.request["job_id"]
        handler.waited = True
        handler.set_status(202)
        handler.set_header("Content-Type", f"{MEDIA_TYPE}; charset=utf-8")
        handler.set_header("Cache-Control", "no-cache")
        handler.set_header("X-Accel-Buffering", "no")
        try:
            handler.write(event("submitted", self.submitted))
            await handler.flush()
            while not self.closed:
                pieces = service.token_streams.take(request_id)
                if pieces:
                    handler.write("".join(event("tokens", {"samples": piece}) for piece in pieces))
                    await handler.flush()
                    continue
                # A worker reports its tokens before it reports the end, in order: none is left behind.
                row = service.store.get_request(request_id)
                if row["status"] in states.REQUEST_TERMINAL:
                    handler.write(event("result", public_request(row, [], 0)))
                    handler.finish()
                    return
                if not await service.token_streams.news(request_id, service.requests.waiters, HEARTBEAT_S):
                    handler.write(": heartbeat\n\n")
                    await handler.flush()
        except StreamClosedError:
            self.closed = True
        finally:
            service.token_streams.close(request_id)
        # The client left before the end: stop the sampler instead of decoding for no one.
        service.requests.cancel(handler.principal, job_id, request_id)
