"""The data plane: submit an operation (202 + request id), poll it, fetch its tensors, cancel it."""

from __future__ import annotations

import asyncio

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import MAX_WAIT_S

from .base import BaseHandler
from .generate_stream import GenerateStream


class OperationHandler(BaseHandler):
    """POST /v1/jobs/{job_id}/{op}: the op is the route's name (forward_backward, step, ...)."""

    _stream: GenerateStream | None = None

    def body_limit(self) -> int:
        # A frame assembled from uploaded chunks arrives by reference, not in the body.
        return self.service.settings.max_body_bytes

    async def post(self, job_id: str) -> None:
        async with self.idempotency_turn():
            if not self.replay_if_seen():
                await self._submit(job_id)

    async def _submit(self, job_id: str) -> None:
        op = self.route.name
        sub_job = self.query_args().sub_job
        header = self.request.headers.get(wire.SEQUENCE_HEADER)
        sequence = wire.parse_sequence(header) if header else None
        upload_id = self.request.headers.get(wire.UPLOAD_HEADER)
        if upload_id:
            # Reading and hashing up to 1 GiB of chunks happens in a thread: other clients keep being answered.
            sha256 = self.request.headers.get(wire.UPLOAD_SHA_HEADER, "")
            body = await asyncio.to_thread(self.service.uploads.take, self.principal, upload_id, sha256)
            json_body = None
        elif not isinstance(self.route.body, type):  # a frame
            body, json_body = self.body, None
        else:
            try:
                body, json_body = b"", self.parse_body()
            except ApiError as exc:
                if sequence is not None:
                    # a refused numbered submission uses up its number, so the ones after it are not held
                    self.service.requests.refuse(self.principal, job_id, sequence, exc)
                raise
        request = await self.service.requests.submit_async(
            self.principal, job_id, op, body, json_body, sub_job, sequence
        )
        response = {
            "request_id": request["id"],
            "job_id": job_id,
            "sub_job_id": request["sub_job_id"],
            "status": request["status"],
        }
        # A retry of a streamed generate (same Idempotency-Key) is answered with its request id, to poll.
        self.remember(202, response)
        if op == "generate" and getattr(json_body, "stream", False):
            self._stream = GenerateStream(self, request, response)
            await self._stream.send()
            return
        self.write_json(response, 202)

    def on_connection_close(self) -> None:
        if self._stream is not None:
            self._stream.client_left()


class RequestsHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        limit = min(self.query_args().limit, 1000)
        self.write_json({"requests": self.service.requests.list(self.principal, job_id, limit)})


class RequestHandler(BaseHandler):
    async def get(self, job_id: str, request_id: str) -> None:
        query = self.query_args()
        self.write_json(
            await self.service.requests.get(
                self.principal,
                job_id,
                request_id,
                query.cursor,
                min(query.max_events, 1000),
                min(query.wait, MAX_WAIT_S),
            )
        )


class RequestTensorsHandler(BaseHandler):
    def get(self, job_id: str, request_id: str) -> None:
        data = self.service.requests.tensors(self.principal, job_id, request_id)
        self.set_header("Content-Type", wire.FRAME_CONTENT_TYPE)
        self.set_header("X-Cortex-Sha256", wire.sha256_hex(data))
        self.finish(data)


class RequestCancelHandler(BaseHandler):
    def post(self, job_id: str, request_id: str) -> None:
        self.write_json(self.service.requests.cancel(self.principal, job_id, request_id))


class RouterReplayDiscardHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        body = self.parse_body()
        self.write_json(self.service.requests.router_replay_discard(self.principal, job_id, body.routes_ids))
