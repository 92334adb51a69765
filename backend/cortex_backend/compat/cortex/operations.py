"""POST /{job_id}/operation, the SDK's multiplexer: forward (fwd, fwd_no_grad), weight-sync,
cancel-request, tail-logs, reset-prefix-cache, bootstrap-router-replay and router-replay-discard; the
operations of Snowflake's own runtime answer `not_supported`."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from ...logs import MAX_PAGE
from . import batches
from .base import CortexHandler
from .data_plane import PART_SEPARATOR, submitted
from .errors import not_supported
from .jobs import our_sub_job_id, sdk_sub_job_id
from .polling import sdk_request_status

WEIGHT_FORMATS = {"lora": "lora", "hf": "full", "vllm": "full", "full": "full"}
UNSUPPORTED = {
    "zmd-events": "zone scheduling events do not exist here; watch a job's state changes with"
    " cortex_nb.Client.list_events() or GET /v1/events",
}
OPERATIONS = (
    "forward",
    "weight-sync",
    "cancel-request",
    "tail-logs",
    "reset-prefix-cache",
    "bootstrap-router-replay",
    "router-replay-discard",
)
SUB_JOB_TYPES = {
    "training": states.TRAINING,
    "sampling": states.SAMPLING,
    "log_probability": states.LOG_PROBABILITY,
    "log_prob": states.LOG_PROBABILITY,
}


class OperationHandler(CortexHandler):
    def post(self, database: str, schema: str, job_id: str) -> None:
        body = self.json_body()
        kind = body.get("operation_type")
        if kind in UNSUPPORTED:
            raise not_supported(f"operation {kind}: {UNSUPPORTED[kind]}", "operation_type")
        handler = {
            "forward": self._forward,
            "weight-sync": self._weight_sync,
            "cancel-request": self._cancel,
            "tail-logs": self._tail_logs,
            "reset-prefix-cache": self._reset_prefix_cache,
            "bootstrap-router-replay": self._bootstrap_router_replay,
            "router-replay-discard": self._router_replay_discard,
        }.get(kind)
        if handler is None:
            raise ApiError(
                "invalid_field",
                f"operation_type: {kind!r} is not one of {sorted(OPERATIONS)}",
                {"field": "operation_type"},
            )
        job = self.service.jobs.visible_job(self.principal, job_id)
        if kind == "reset-prefix-cache" and not any(
            sub["type"] == SUB_JOB_TYPES.get(str(body.get("sub_job_type"))) for sub in job["sub_jobs"]
        ):
            # The SDK names `sampling` by default; a job without a sampler resets its trainer's engine.
            body = {key: value for key, value in body.items() if key != "sub_job_type"}
        self.write_json(handler(job, self._target(job, body), body.get("payload") or {}))

    def _target(self, job: dict[str, Any], body: dict[str, Any]) -> str | None:
        """The sub-job the routing hints name (both, when given, must agree), or None for the default."""
        by_id = our_sub_job_id(job, body["sub_job_id"], "sub_job_id") if body.get("sub_job_id") else None
        by_type = None
        if body.get("sub_job_type"):
            kind = SUB_JOB_TYPES.get(str(body["sub_job_type"]))
            matches = [sub["id"] for sub in job["sub_jobs"] if sub["type"] == kind]
            if not matches:
                raise ApiError(
                    "invalid_field",
                    f"sub_job_type: job {job['id']} has no {body['sub_job_type']!r} sub-job",
                    {"field": "sub_job_type"},
                )
            by_type = matches[0]
            if by_id is not None and by_id not in matches:
                raise ApiError(
                    "invalid_field",
                    f"sub_job_id {body['sub_job_id']!r} is not a {body['sub_job_type']} sub-job",
                    {"field": "sub_job_id"},
                )
        return by_id or by_type

    def _forward(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        """Scoring without gradients (what fwd and fwd_no_grad send): the service's `forward` op. Without a
        routing hint it scores the trainer's live weights (what the SDK's users mean), not a log-probability
        sub-job's, which stay stale until a weight sync."""
        if target is None:
            target = next((sub["id"] for sub in job["sub_jobs"] if sub["type"] == states.TRAINING), None)
        frame = batches.forward_frame(payload)
        request = self.service.requests.submit(self.principal, job["id"], "forward", frame, None, target)
        return submitted(job["id"], [request["id"]])

    def _weight_sync(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ApiError("invalid_field", "payload: must be an object", {"field": "payload"})
        weight_format = str(payload.get("weight_format") or "vllm").lower()
        if weight_format not in WEIGHT_FORMATS:
            raise ApiError(
                "invalid_field",
                f"payload.weight_format: one of {sorted(WEIGHT_FORMATS)}",
                {"field": "payload.weight_format"},
            )
        ours: dict[str, Any] = {"format": WEIGHT_FORMATS[weight_format]}
        if payload.get("source_sub_job_id"):
            ours["source"] = our_sub_job_id(job, payload["source_sub_job_id"], "payload.source_sub_job_id")
        if payload.get("target_sub_job_ids") is not None:
            targets = payload["target_sub_job_ids"]
            if not isinstance(targets, list):
                raise ApiError(
                    "invalid_field",
                    "payload.target_sub_job_ids: must be a list",
                    {"field": "payload.target_sub_job_ids"},
                )
            ours["targets"] = [our_sub_job_id(job, t, "payload.target_sub_job_ids") for t in targets]
        request = self.service.requests.submit(self.principal, job["id"], "weight_sync", b"", ours, None)
        return submitted(job["id"], [request["id"]])

    def _reset_prefix_cache(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        """The service's `reset_prefix_cache` op: queued behind the sub-job's earlier requests, which is
        what the SDK's `drain` asks for; its result says what the engine dropped."""
        request = self.service.requests.submit(
            self.principal, job["id"], "reset_prefix_cache", b"", {}, target
        )
        return submitted(job["id"], [request["id"]])

    def _bootstrap_router_replay(
        self, job: dict[str, Any], target: str | None, payload: Any
    ) -> dict[str, Any]:
        """From now on every generate on the source sub-job keeps its samples' routes (each sample's
        `sample_id` names them) for the target trainer to replay, within `max_cache_bytes`."""
        if not isinstance(payload, dict):
            raise ApiError("invalid_field", "payload: must be an object", {"field": "payload"})
        for field in ("source_sub_job_id", "target_sub_job_id"):
            if not payload.get(field):
                raise ApiError("invalid_field", f"payload.{field}: required", {"field": f"payload.{field}"})
        cap = payload.get("max_cache_bytes")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool)):
            raise ApiError(
                "invalid_field", "payload.max_cache_bytes: an integer", {"field": "payload.max_cache_bytes"}
            )
        pairing = self.service.requests.router_replay_bootstrap(
            self.principal,
            job["id"],
            our_sub_job_id(job, payload["source_sub_job_id"], "payload.source_sub_job_id"),
            our_sub_job_id(job, payload["target_sub_job_id"], "payload.target_sub_job_id"),
            cap,
        )
        return {
            **pairing,
            "job_id": job["id"],
            "source_sub_job_id": sdk_sub_job_id(job["id"], pairing["source_sub_job_id"]),
            "target_sub_job_id": sdk_sub_job_id(job["id"], pairing["target_sub_job_id"]),
        }

    def _router_replay_discard(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        """Free the named samples' routes (all of the job's when none are named)."""
        sample_ids = payload.get("sample_ids") if isinstance(payload, dict) else None
        if sample_ids is not None and (
            not isinstance(sample_ids, list) or not all(isinstance(s, str) for s in sample_ids)
        ):
            raise ApiError(
                "invalid_field", "payload.sample_ids: a list of sample ids", {"field": "payload.sample_ids"}
            )
        return {
            "job_id": job["id"],
            **self.service.requests.router_replay_discard(self.principal, job["id"], sample_ids),
        }

    def _cancel(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        request_id = payload.get("request_id") if isinstance(payload, dict) else None
        if not isinstance(request_id, str) or not request_id:
            raise ApiError(
                "invalid_field", "payload.request_id: the request to cancel", {"field": "payload.request_id"}
            )
        statuses = [
            self.service.requests.cancel(self.principal, job["id"], part)["status"]
            for part in request_id.split(PART_SEPARATOR)
        ]
        return {
            "request_id": request_id,
            "job_id": job["id"],
            "status": sdk_request_status(statuses),
            "cancel_requested": True,
        }

    def _tail_logs(self, job: dict[str, Any], target: str | None, payload: Any) -> dict[str, Any]:
        payload = payload if isinstance(payload, dict) else {}
        try:
            cursor = int(payload.get("cursor") or 0)
            max_lines = int(payload.get("max_lines") or 1000)
        except (TypeError, ValueError):
            raise ApiError(
                "invalid_field", "payload.cursor and payload.max_lines are integers", {"field": "payload"}
            ) from None
        redacted = job["owner"] != self.principal.owner
        page = self.service.logs.page(
            job["id"], max(cursor, 0), max(1, min(max_lines, MAX_PAGE)), target, redacted
        )
        entries = [
            {
                **line,
                "sub_job_id": sdk_sub_job_id(job["id"], line["sub_job_id"])
                if line.get("sub_job_id")
                else None,
            }
            for line in page["lines"]
        ]
        return {
            "entries": entries,
            "next_cursor": str(page["cursor"]),
            "eof": not entries,
            "dropped": page["dropped"],
            "job_status": job["status"],
        }
