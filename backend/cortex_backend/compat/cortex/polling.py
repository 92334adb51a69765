"""GET /{job_id}/requests/{request_id}: a request's state in the SDK's words, its result as a DSSST1
frame (base64 in the JSON, or `result_chunk` events paged by `next_cursor` when large).

The SDK polls with sleeps that start at 0.5 s. This answer is held open (up to HOLD_S) until the request
ends, so a poll returns the moment the result exists and the SDK's first sleep is usually never taken.
"""

from __future__ import annotations

import time
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from ..query import clamped_int
from . import batches, dssst1
from .base import CortexHandler
from .data_plane import PART_SEPARATOR
from .jobs import iso
from .streaming import stream_events

HOLD_S = 10.0
# Results up to this size travel inline (base64); larger ones as result_chunk events of this size.
RESULT_CHUNK_BYTES = 4 * 1024 * 1024
REQUEST_STATES = {
    states.REQUEST_QUEUED: "pending",
    states.REQUEST_RUNNING: "running",
    states.REQUEST_SUCCEEDED: "done",
    states.REQUEST_FAILED: "failed",
    states.REQUEST_CANCELLED: "cancelled",
}


def sdk_request_status(statuses: list[str]) -> str:
    """One state for a request made of parts: the first failure or cancel wins, done only when all are."""
    mapped = [REQUEST_STATES.get(status, status) for status in statuses]
    for state in ("failed", "cancelled", "running", "pending"):
        if state in mapped:
            return state
    return "done"


class RequestHandler(CortexHandler):
    async def get(self, database: str, schema: str, job_id: str, request_id: str) -> None:
        parts = request_id.split(PART_SEPARATOR)
        if len(parts) > 1024:
            raise ApiError(
                "invalid_field", "request_id: not a request id this surface gave out", {"field": "request_id"}
            )
        streamed = await stream_events(self, job_id, request_id, HOLD_S)
        if streamed is not None:
            views, events = streamed
            self.write_json({**self._render(job_id, request_id, views), "events": events})
            return
        deadline = time.monotonic() + HOLD_S
        views = [
            await self.service.requests.get(self.principal, job_id, part, 0, 1000, 0.0) for part in parts
        ]
        while any(view["status"] not in states.REQUEST_TERMINAL for view in views):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.waited = True
            index = next(i for i, view in enumerate(views) if view["status"] not in states.REQUEST_TERMINAL)
            views[index] = await self.service.requests.get(
                self.principal, job_id, parts[index], views[index]["cursor"], 1000, remaining
            )
        self.write_json(self._render(job_id, request_id, views))

    def _render(self, job_id: str, request_id: str, views: list[dict[str, Any]]) -> dict[str, Any]:
        status = sdk_request_status([view["status"] for view in views])
        failed = [view for view in views if view.get("error")]
        answer: dict[str, Any] = {
            "request_id": request_id,
            "job_id": job_id,
            "operation": views[0]["op"],
            "status": status,
            "created_at": iso(min(view["created_at"] for view in views)),
            "updated_at": iso(
                max(view["finished_at"] or view["started_at"] or view["created_at"] for view in views)
            ),
            "result": {},
            "error": f"{failed[0]['error']['code']}: {failed[0]['error']['message']}" if failed else "",
            "events": [],
            "next_cursor": "",
        }
        if status != "done":
            return answer
        frame = dssst1.dumps(self._result(job_id, views))
        if len(frame) <= RESULT_CHUNK_BYTES:
            answer["result"] = dssst1.base64_result(frame)
            return answer
        chunks = dssst1.result_chunks(frame, RESULT_CHUNK_BYTES)
        start = self._cursor()
        page = chunks[start : start + self._max_events()]
        answer["events"] = [dssst1.result_chunk_event(chunk) for chunk in page]
        following = start + len(page)
        answer["next_cursor"] = str(following) if following < len(chunks) else ""
        return answer

    def _cursor(self) -> int:
        raw = self.get_query_argument("cursor", "") or "0"
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            raise ApiError(
                "invalid_field", "cursor: the next_cursor of the previous poll", {"field": "cursor"}
            )
        return int(raw)

    def _max_events(self) -> int:
        return clamped_int(self, "max_events", 16, 1, 512)

    def _result(self, job_id: str, views: list[dict[str, Any]]) -> dict[str, Any]:
        op, result = views[0]["op"], views[0]["result"] or {}
        if op == "forward_backward":
            return {"job_id": job_id, **batches.forward_backward_result(result)}
        if op == "forward":
            tensors = self.service.requests.tensors(self.principal, job_id, views[0]["request_id"])
            return {"job_id": job_id, **batches.forward_result(result, tensors)}
        if op == "step":
            return {"job_id": job_id, **batches.step_result(result)}
        if op == "generate":
            results: list[dict[str, Any]] = []
            for offset, view in enumerate(views):
                results.extend(
                    batches.generate_results(view["result"] or {}, offset if len(views) > 1 else 0)
                )
            return {"job_id": job_id, "results": results, "weight_version": result.get("weight_version")}
        if op == "save":
            checkpoint = result.get("checkpoint") or {}
            return {
                "job_id": job_id,
                "checkpoint_id": result.get("checkpoint_id"),
                "checkpoint_tag": result.get("checkpoint_id"),
                "checkpoint_type": result.get("type"),
                "global_steps": result.get("step"),
                "size_bytes": result.get("size_bytes"),
                "sub_job_id": checkpoint.get("sub_job_id"),
            }
        if op == "weight_sync":
            return {
                "job_id": job_id,
                **result,
                "bytes_sent": result.get("bytes"),
                "transfer": result.get("path"),
            }
        return {"job_id": job_id, **result}
