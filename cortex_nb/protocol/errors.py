"""Every error and failure code, in one table: its HTTP status, what it means, and where it appears.

A code is stable: clients, notebooks and the panel match on it. The backend answers
`{"error": {"code", "message", "detail"}}` with the code's status; a job, sub-job, request or source run
that ends badly carries a code from here as its `failure_code` (or its request's `error.code`); the client
raises a few codes itself (a local wait that ran out, a damaged download). `ApiError` is how the backend
(and the Jupyter proxy) raises one; the client's exception classes live in `cortex_nb.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Where a code appears besides an HTTP error answer.
JOB = "job"  # a job's (or sub-job's) failure_code
REQUEST = "request"  # a data-plane request's error.code
RUN = "run"  # a source run's failure_code
CLIENT = "client"  # raised by the kernel-side client itself, never sent by the backend


@dataclass(frozen=True)
class ErrorCode:
    code: str
    status: int | None  # HTTP status of an error answer with this code; None: never an HTTP answer
    meaning: str
    ends: tuple[str, ...] = ()  # JOB / REQUEST / RUN / CLIENT


ERROR_CODES: dict[str, ErrorCode] = {
    entry.code: entry
    for entry in (
        # 400: the request itself is wrong
        ErrorCode(
            "invalid_request",
            400,
            "the request is malformed (a header or parameter is missing or wrong); see the message",
        ),
        ErrorCode("invalid_json", 400, "the body is not strict JSON, or not a JSON object"),
        ErrorCode(
            "invalid_field", 400, "a field of the body or a parameter is wrong; `detail.field` names it"
        ),
        ErrorCode("invalid_frame", 400, "the body is not a well-formed tensor frame (docs/wire.md)"),
        ErrorCode(
            "invalid_batch",
            400,
            "the batch does not fit the model or the loss (shapes, dtypes, token ids, length)",
            (REQUEST,),
        ),
        ErrorCode("unknown_loss", 400, "loss_fn names no loss this backend has"),
        ErrorCode("unknown_model", 400, "base_model names no registered model (GET /v1/models lists them)"),
        ErrorCode("invalid_model_name", 400, "base_model is not a model name (a path or URL, say)"),
        ErrorCode("too_many_training_sub_jobs", 400, "a job has at most one training sub-job"),
        ErrorCode(
            "unsupported_operation", 400, "the sub-job (or model) does not serve this operation", (REQUEST,)
        ),
        ErrorCode(
            "invalid_checkpoint_id",
            400,
            "a checkpoint id is 1-64 letters, digits, '_', '.', '-' and never a path",
        ),
        ErrorCode(
            "chunk_mismatch", 400, "a chunk or an assembled upload does not match its SHA-256; send it again"
        ),
        ErrorCode(
            "spec_invalid", 400, "the run spec (cortex.yaml) was refused; the message names the key", (RUN,)
        ),
        ErrorCode(
            "exceeds_capacity",
            400,
            "the job or run needs more devices (or memory) than this backend has (a pending"
            " job fails so when the hosts left in a cluster can never hold it)",
            (JOB,),
        ),
        ErrorCode("hash_mismatch", 400, "a dataset's bytes do not have the SHA-256 its id says"),
        ErrorCode(
            "invalid_dataset",
            400,
            "the dataset is not JSONL training rows, or could not be cut into training rows",
            (JOB,),
        ),
        ErrorCode("manifest_mismatch", 400, "a run's uploaded files do not match their SHA-256 manifest"),
        ErrorCode(
            "incompatible_adapter",
            400,
            "the weights do not fit the sub-job's adapter (base model, rank or target modules)",
            (REQUEST,),
        ),
        # 401 / 403
        ErrorCode("unauthenticated", 401, "the token is missing, wrong or revoked"),
        ErrorCode("forbidden", 403, "the token lacks a scope; `detail.missing_scopes` names it"),
        ErrorCode(
            "route_not_proxied", 403, "the Jupyter proxy never forwards this route; call the backend directly"
        ),
        # 404
        ErrorCode("not_found", 404, "the thing asked for does not exist (an upload, a request's tensors)"),
        ErrorCode("job_not_found", 404, "no such job is visible to this token"),
        ErrorCode("request_not_found", 404, "the job has no such request"),
        ErrorCode("route_not_found", 404, "no route has this path"),
        ErrorCode("checkpoint_not_found", 404, "the job has no such checkpoint"),
        ErrorCode("run_not_found", 404, "no such source run is visible to this token"),
        ErrorCode("output_not_declared", 404, "the run declares no output of this name"),
        ErrorCode("dataset_not_found", 404, "no such dataset is visible to this token; upload it"),
        # the Tinker face (backend/cortex_backend/compat/tinker, docs/tinker.md)
        ErrorCode("session_not_found", 404, "no such Tinker session is visible to this key"),
        ErrorCode("model_not_found", 404, "no such Tinker training or sampling model is visible to this key"),
        # 405
        ErrorCode("method_not_allowed", 405, "the route exists but not with this method"),
        # 409: the request is fine but the state of things forbids it now
        ErrorCode("conflict", 409, "the id is taken, or the upload was used already"),
        ErrorCode(
            "job_id_unavailable",
            409,
            "the job_id is taken (by anyone: the answer never says whose); choose another or omit it",
        ),
        ErrorCode(
            "no_host_for_model",
            409,
            "no host of the cluster that is up now has the model (a pending job fails so when"
            " the last such host leaves)",
            (JOB,),
        ),
        ErrorCode(
            "job_finished", 409, "the job has ended (or is completing) and takes no new requests", (REQUEST,)
        ),
        ErrorCode(
            "idempotency_key_reused", 409, "this Idempotency-Key was used before with a different body"
        ),
        ErrorCode("checkpoint_in_use", 409, "a load or export reads the checkpoint; delete it after"),
        ErrorCode("checkpoint_exists", 409, "the job already has a checkpoint with this id"),
        ErrorCode(
            "output_not_available",
            409,
            "the output was not collected (not written, or the run is still going)",
        ),
        ErrorCode(
            "checkpoint_corrupted",
            409,
            "a checkpoint file no longer matches its SHA-256; it was not loaded",
            (REQUEST, CLIENT),
        ),
        # 410
        ErrorCode(
            "session_expired",
            410,
            "the Tinker session ended (finished, or its heartbeats stopped); start a new one",
        ),
        # a chunk group of the Cortex SDK surface (docs/cortex-sdk.md): replay it from chunk 0, or stop
        ErrorCode("chunk_group_restart_required", 409, "the chunk group was lost; replay it from chunk 0"),
        ErrorCode("chunk_group_conflict", 409, "the chunk group was started with other parameters"),
        ErrorCode(
            "chunk_group_missing_chunks", 409, "the chunk group was closed before all its chunks arrived"
        ),
        # 413 / 429 / 5xx
        ErrorCode(
            "body_too_large", 413, "the body is larger than this route takes; send large frames as chunks"
        ),
        ErrorCode(
            "quota_exceeded",
            413,
            "the owner's checkpoint quota would be exceeded; nothing was kept",
            (REQUEST,),
        ),
        ErrorCode("rate_limited", 429, "too many requests at once; retry after a moment"),
        ErrorCode("internal_error", 500, "the backend hit an unexpected error; it is logged"),
        ErrorCode(
            "too_many_connections",
            503,
            "the backend has as many connections open as it allows (--max-connections); retry shortly",
        ),
        ErrorCode("proxy_not_configured", 501, "the Jupyter server has no backend token to forward with"),
        ErrorCode(
            "not_supported",
            501,
            "a compatibility face was asked for something that cannot exist here;"
            " the message names the cortex-nb way to do it",
        ),
        ErrorCode("backend_unavailable", 502, "the backend does not answer"),
        ErrorCode("version_mismatch", 502, "the backend speaks another API major version", (CLIENT,)),
        ErrorCode(
            "reply_mismatch",
            None,
            "a backend's answer does not match its route's schema (client and backend versions differ)",
            (CLIENT,),
        ),
        # ends of jobs, requests and runs
        ErrorCode("cancelled", None, "cancelled by the user", (JOB, REQUEST, RUN)),
        ErrorCode(
            "backend_restarted", None, "the backend restarted while this was in flight", (JOB, REQUEST, RUN)
        ),
        ErrorCode("worker_crashed", None, "the worker process serving the sub-job died", (JOB, REQUEST)),
        ErrorCode("worker_start_failed", None, "the worker could not load the model or start", (JOB,)),
        ErrorCode("out_of_memory", None, "the device ran out of memory", (JOB, REQUEST)),
        ErrorCode(
            "host_lost",
            None,
            "the host running the sub-job left the cluster (its node died or was removed)",
            (JOB,),
        ),
        ErrorCode("operation_failed", None, "the operation raised an error; see the message", (REQUEST,)),
        ErrorCode(
            "no_gradients", None, "step found no gradients to apply: call forward_backward first", (REQUEST,)
        ),
        ErrorCode(
            "non_finite_gradients",
            None,
            "a step's gradient norm was NaN or infinite; lower the learning rate or clip gradients",
            (JOB, REQUEST),
        ),
        ErrorCode(
            "training_loop_failed",
            None,
            "the managed training loop raised an error; see the message and the job's logs",
            (JOB,),
        ),
        ErrorCode(
            "weight_sync_failed",
            None,
            "a sampler could not take the trainer's weights; it kept its previous ones",
            (REQUEST,),
        ),
        ErrorCode(
            "weight_sync_timeout", None, "a weight-sync participant did not answer in time", (REQUEST,)
        ),
        # source runs (docs/run-spec.md)
        ErrorCode(
            "workload_runtime_failed",
            None,
            "the command exited non-zero or was killed by a signal; see exit_code and the logs",
            (RUN,),
        ),
        ErrorCode(
            "workload_out_of_memory",
            None,
            "the workload ran out of memory (the run's memory limit, its address-space limit, or the device's)",
            (RUN,),
        ),
        ErrorCode(
            "disk_quota_exceeded",
            None,
            "the run's work dir passed its quota (--run-disk-mib) and the run was stopped",
            (RUN,),
        ),
        ErrorCode("output_missing", None, "a required output was not written", (RUN,)),
        ErrorCode("output_too_large", None, "an output is larger than its max_bytes", (RUN,)),
        ErrorCode("timed_out", None, "the run passed its timeout_seconds and was stopped", (RUN,)),
        ErrorCode(
            "isolation_unsupported",
            None,
            "isolation: required, and this host cannot give the run its sandbox or per-run limits",
            (RUN,),
        ),
        ErrorCode(
            "sandbox_failed", None, "the backend could not set up the run's sandbox; see the message", (RUN,)
        ),
        # raised by the client itself
        ErrorCode(
            "timeout",
            None,
            "waiting locally ran out of time; the remote request, job or run keeps going",
            (CLIENT,),
        ),
        ErrorCode(
            "submission_outcome_unknown",
            None,
            "a run was submitted and no answer came back; resume it by its submission id",
            (CLIENT,),
        ),
        ErrorCode(
            "output_corrupted",
            None,
            "a downloaded run output does not match its recorded length or SHA-256",
            (CLIENT,),
        ),
    )
}

# code -> HTTP status, for the codes an error answer carries
ERROR_STATUS: dict[str, int] = {
    code: entry.status for code, entry in ERROR_CODES.items() if entry.status is not None
}
# code -> meaning, for the codes a job, sub-job or request ends with
FAILURE_CODES: dict[str, str] = {
    code: entry.meaning for code, entry in ERROR_CODES.items() if JOB in entry.ends or REQUEST in entry.ends
}
# code -> meaning, for the codes a source run ends with
RUN_FAILURE_CODES: dict[str, str] = {
    code: entry.meaning for code, entry in ERROR_CODES.items() if RUN in entry.ends
}


def status_for(code: str) -> int:
    """HTTP status for an error code; unknown codes are server errors so they are never silent."""
    return ERROR_STATUS.get(code, 500)


class CortexError(Exception):
    """Base of every error the client raises. `code` is a stable code from `ERROR_CODES`."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "internal_error",
        status: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail = detail or {}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ApiError(CortexError):
    """Raised inside the backend: rendered as `{"error": {code, message, detail}}` with the code's status."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code, status=status_for(code), detail=detail)
