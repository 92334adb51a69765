"""Data-plane submissions: forward-backward and generate (DSSST1 frames, maybe chunked), step, save and
load (JSON). Each becomes an ordinary request of the service and answers `{request_id, job_id}`."""

from __future__ import annotations

import asyncio
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from . import batches, dssst1
from .base import FRAME_BODY_LIMIT, CortexHandler
from .chunk_groups import received
from .jobs import our_sub_job_id
from .sampling import generate_requests

# A generate with different sampling params per prompt runs as one request per prompt; the SDK gets one
# id, these joined with "+" (our ids never hold one), and the poll puts the results back in prompt order.
PART_SEPARATOR = "+"


def submitted(job_id: str, request_ids: list[str]) -> dict[str, Any]:
    return {"request_id": PART_SEPARATOR.join(request_ids), "job_id": job_id, "status": "pending"}


class FrameOperationHandler(CortexHandler):
    """POST /{job_id}/forward-backward and /{job_id}/generate: one DSSST1 frame, or its chunks in order."""

    def body_limit(self) -> int:
        return FRAME_BODY_LIMIT

    async def post(self, database: str, schema: str, job_id: str) -> None:
        operation = self.operation
        # Reading, spooling, assembling and decoding frames (up to 1 GiB) run in threads: the IO loop keeps
        # answering other clients meanwhile.
        job = self.service.jobs.visible_job(self.principal, job_id)
        body = self.body
        chunk = await asyncio.to_thread(dssst1.request_chunk, body)
        if job["status"] in states.JOB_TERMINAL and (chunk is None or chunk.index == 0):
            # Refused before any chunk is held (the service refuses a whole frame the same way).
            raise ApiError(
                "job_finished",
                f"job {job_id} is {job['status']}; create a new job (and load a checkpoint,"
                " if you saved one)",
                {"status": job["status"], "failure_code": job["failure_code"]},
            )
        if chunk is None:
            self.write_json(await self._submit(job_id, operation, body), 202)
            return
        groups = self.face.chunk_groups
        async with self.face.group_turn((self.principal.owner, job_id, chunk.group_id or chunk.frame_sha256)):
            replay = groups.submitted(self.principal, job_id, chunk)
            if replay is not None:
                self.write_json(replay, 202 if "request_id" in replay else 200)
                return
            frame = await asyncio.to_thread(groups.add, self.principal, job_id, chunk)
            if frame is None:
                self.write_json(received(chunk), 200)
                return
            response = await self._submit(job_id, operation, frame)
            groups.remember(self.principal, job_id, chunk, response)
        self.write_json(response, 202)

    async def _submit(self, job_id: str, operation: str, frame: bytes) -> dict[str, Any]:
        submit = self.service.requests.submit
        if operation == "forward_backward":
            ours = await asyncio.to_thread(batches.forward_backward_frame, frame)
            request = await self.service.requests.submit_async(
                self.principal, job_id, "forward_backward", ours, None, None
            )
            return submitted(job_id, [request["id"]])
        value, _ = await asyncio.to_thread(dssst1.loads, frame)
        parts = generate_requests(value)
        ids = []
        for prompts, params, _ in parts:
            body = {"prompts": prompts, "sampling_params": params}
            ids.append(submit(self.principal, job_id, "generate", b"", body, None)["id"])
        return submitted(job_id, ids)


class JsonOperationHandler(CortexHandler):
    """POST /{job_id}/step, /save, /load."""

    def post(self, database: str, schema: str, job_id: str) -> None:
        operation = self.operation
        body = self.json_body()
        if operation == "step":
            self._only(body, {"learning_rate"})
            ours = {"learning_rate": body["learning_rate"]} if body.get("learning_rate") is not None else {}
        elif operation == "save":
            self._only(body, {"checkpoint_id", "checkpoint_type"})
            ours = {"type": str(body.get("checkpoint_type") or "resumable").lower()}
            if body.get("checkpoint_id") is not None:
                ours["checkpoint_id"] = body["checkpoint_id"]
        else:
            self._only(body, {"checkpoint_id", "source_job_id", "target_sub_job_id"})
            ours = {key: body[key] for key in ("checkpoint_id", "source_job_id") if body.get(key) is not None}
            if body.get("target_sub_job_id") is not None:
                job = self.service.jobs.visible_job(self.principal, job_id)
                ours["target_sub_job_id"] = our_sub_job_id(
                    job, body["target_sub_job_id"], "target_sub_job_id"
                )
        request = self.service.requests.submit(self.principal, job_id, operation, b"", ours, None)
        self.write_json(submitted(job_id, [request["id"]]), 202)

    @staticmethod
    def _only(body: dict[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise ApiError(
                "invalid_field",
                f"{unknown[0]}: unknown field; this call takes {sorted(allowed)}",
                {"field": unknown[0]},
            )
