"""retrieve_future: wait (a bounded long-poll) for what a future names, then answer as the SDK expects:
`try_again` while pending, `{error, category}` when it failed, else the result (protobuf for forward_backward
and sample results, JSON for the rest)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cortex_nb.protocol import states

from ...auth import Principal
from ..face_errors import tinker_category
from . import messages, names, translate
from .face import TinkerFace
from .futures import Future

# What the backend's own optim_step metrics are prefixed with (never a caller's column, such as the cookbook's `step`).
METRIC_PREFIX = "cortex/"
# The SDK waits 45 s for each retrieve_future answer and asks again at once after `try_again`.
LONG_POLL_S = 25.0


class Pending(Exception):
    def __init__(self, queue_state: str, reason: str | None = None) -> None:
        self.queue_state, self.reason = queue_state, reason


class Failed(Exception):
    def __init__(self, message: str, code: str | None) -> None:
        self.message, self.code = message, code


async def retrieve(
    face: TinkerFace, principal: Principal, future_id: Any
) -> tuple[str, bytes | dict[str, Any]]:
    """("proto", bytes) or ("json", dict) for one retrieve_future call."""
    future = face.futures.get(principal, future_id)
    deadline = time.monotonic() + LONG_POLL_S
    cursor = 0
    while True:
        try:
            return _outcome(face, principal, future)
        except Pending as pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                body = {"type": "try_again", "request_id": future.id, "queue_state": pending.queue_state}
                if pending.reason:
                    body["queue_state_reason"] = pending.reason
                return "json", body
            if future.request_id is not None:
                status = await face.service.requests.get(
                    principal, future.job_id, future.request_id, cursor, 100, remaining
                )
                cursor = status["cursor"]
            else:
                job = face.service.store.get_job(future.job_id)
                await face.service.jobs.wait_for_change(principal, future.job_id, job["status"], remaining)
        except Failed as failed:
            return "json", {"error": failed.message, "category": tinker_category(failed.code)}


def _job_pending(face: TinkerFace, principal: Principal, job: dict[str, Any]) -> Pending:
    """A waiting job's queue state: `paused_capacity` with the scheduler's own queue reason (what the SDK's warning
    prints), while the job waits for a device. No per-owner rate limit holds jobs here, so never
    `paused_rate_limit`."""
    if job["status"] == states.JOB_PENDING:
        queue = face.service.job_views.queue.for_job(job["id"], principal)
        reason = queue["reason"] if queue is not None else "waiting for a device"
        return Pending(
            "paused_capacity",
            f"job {job['id']}: {reason} (GET /v1/capacity shows what holds them)",
        )
    return Pending("active")


def _outcome(face: TinkerFace, principal: Principal, future: Future) -> tuple[str, bytes | dict[str, Any]]:
    if future.kind == "create_custom_loss":  # checked and kept when it was created: nothing to wait for
        return "json", {"type": "create_custom_loss", "loss_id": future.render["loss_id"]}
    job = face.service.jobs.visible_job(principal, future.job_id)
    if future.request_id is None:
        return "json", _job_outcome(face, principal, job, future)
    request = face.service.store.get_request(future.request_id)
    if request["status"] in (states.REQUEST_QUEUED, states.REQUEST_RUNNING):
        raise (
            _job_pending(face, principal, job)
            if request["status"] == states.REQUEST_QUEUED
            else Pending("active")
        )
    if request["status"] != states.REQUEST_SUCCEEDED:
        code = request["error_code"] or request["status"]
        raise Failed(
            f"{request['op']} {request['status']} ({code}): {request['error_message'] or ''}".strip(), code
        )
    result = request["result"] or {}
    return _render(face, principal, future, result)


def _job_outcome(
    face: TinkerFace, principal: Principal, job: dict[str, Any], future: Future
) -> dict[str, Any]:
    if job["status"] == states.JOB_RUNNING:
        return {"type": "create_model", "model_id": future.render["model_id"]}
    if job["status"] in states.JOB_TERMINAL:
        raise Failed(
            f"the model's job {job['id']} is {job['status']} ({job['failure_code']}): {job['failure_message'] or ''}".strip(),
            job["failure_code"] if job["failure_code"] != "cancelled" else "cancelled",
        )
    raise _job_pending(face, principal, job)


def _render(
    face: TinkerFace, principal: Principal, future: Future, result: dict[str, Any]
) -> tuple[str, bytes | dict[str, Any]]:
    kind = future.kind
    if kind in ("forward_backward", "forward"):
        frame = face.service.requests.tensors(principal, future.job_id, future.request_id)
        outputs = translate.outputs_from_frame(
            frame,
            future.render["lengths"].tolist(),
            future.render.get("widths", np.zeros(0)).tolist() or None,
        )
        metrics = {
            key: float(value) for key, value in (result.get("metrics") or {}).items() if key.count(":") == 1
        }
        return "proto", messages.encode_forward_backward_output(
            outputs, len(future.render["lengths"]), metrics
        )
    if kind == "sample":
        samples = sorted(result["samples"], key=lambda sample: sample["sample_index"])
        prompt_logprobs = None
        if future.render.get("prompt_logprobs"):
            # ours scores each prompt token after the first; Tinker's list has None for the first
            prompt_logprobs = [None, *result["prompt_logprobs"][0]]
            last_n = future.render.get("last_n")
            if last_n:
                prompt_logprobs[: len(prompt_logprobs) - last_n] = [None] * (len(prompt_logprobs) - last_n)
        topk = None
        if future.render.get("topk"):
            topk = translate.dense_prompt_topk(
                result["prompt_topk_logprobs"][0], future.render["topk"], future.render.get("last_n")
            )
        target = None
        if future.render.get("targets") is not None:
            asked = future.render["targets"]
            values = np.asarray(result["prompt_target_logprobs"][0], dtype=np.float32)
            if asked.csr is None:
                target = messages.tensor_message(values)
            else:
                crow, col = asked.csr
                rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
                listed = values[rows, np.asarray(col, dtype=np.int64)]  # the cells asked, in the order asked
                target = messages.tensor_message(listed, list(asked.ids.shape), asked.csr)
        alt = None
        if future.render.get("alt_k"):
            drawn = result["prompt_alt_tokens"][0]
            alt = (
                np.asarray(drawn["token_ids"], dtype=np.int64),
                np.asarray(drawn["logprobs"], dtype=np.float32),
            )
        return "proto", messages.encode_sample_response(samples, prompt_logprobs, topk, target, alt)
    if kind == "optim_step":
        # Prefixed: callers merge these into their own metrics rows, whose `step` and `learning_rate` are theirs.
        return "json", {
            "metrics": {
                f"{METRIC_PREFIX}grad_norm": result["grad_norm"],
                f"{METRIC_PREFIX}learning_rate": result["learning_rate"],
                f"{METRIC_PREFIX}step": float(result["step"]),
            }
        }
    if kind == "save_state":
        return "json", {
            "type": "save_weights",
            "path": names.tinker_path(future.job_id, result["checkpoint_id"]),
        }
    if kind == "save_external":
        return "json", {
            "type": "save_weights_external",
            "path": names.tinker_path(future.job_id, result["checkpoint_id"]),
            "size_bytes": result.get("size_bytes"),
        }
    if kind == "save_for_sampler":
        if "sampling_session_id" in future.render:
            return "json", {
                "type": "save_weights_for_sampler",
                "sampling_session_id": future.render["sampling_session_id"],
            }
        return "json", {
            "type": "save_weights_for_sampler",
            "path": names.tinker_path(future.job_id, result["checkpoint_id"]),
        }
    if kind == "load":
        return "json", {
            "type": "load_weights",
            "path": future.render["path"],
            "model_id": future.render["model_id"],
        }
    raise AssertionError(f"unknown future kind {kind}")
