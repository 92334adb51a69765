"""Every error and failure code, in one table: its HTTP status, what it means, where it appears, and its
category (the caller's doing, worth retrying, not served here, or the backend's fault).

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

# What a client should do about a code. The compatibility faces derive their SDKs' classifications from this
# (compat/face_errors.py): Tinker's user/server category, the Cortex SDK's statuses.
USER_ERROR = "user"  # the caller's doing: the same call fails the same way; fix it
RETRYABLE = "retryable"  # the backend was busy, away or stopping: the same call may succeed later
NOT_SUPPORTED = "not_supported"  # cannot exist on this backend: the message names what to do instead
INTERNAL = "internal"  # the backend's (or its host's) fault: it is logged
CATEGORIES = (USER_ERROR, RETRYABLE, NOT_SUPPORTED, INTERNAL)


def category_of_status(status: int) -> str:
    """The category an HTTP status implies where a code does not say its own."""
    if status in (429, 502, 503, 507):
        return RETRYABLE
    if status == 501:
        return NOT_SUPPORTED
    return USER_ERROR if status < 500 else INTERNAL


@dataclass(frozen=True)
class ErrorCode:
    code: str
    status: int | None  # HTTP status of an error answer with this code; None: never an HTTP answer
    meaning: str
    ends: tuple[str, ...] = ()  # JOB / REQUEST / RUN / CLIENT
    # One of CATEGORIES; derived from `status` when not given (a code with no status must give it).
    category: str = ""

    def __post_init__(self) -> None:
        if not self.category:
            if self.status is None:
                raise ValueError(f"error code {self.code!r} has no HTTP status: give its category")
            object.__setattr__(self, "category", category_of_status(self.status))
        if self.category not in CATEGORIES:
            raise ValueError(f"error code {self.code!r}: unknown category {self.category!r}")


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
        ErrorCode(
            "router_replay_unsupported",
            400,
            "router replay needs an MoE base whose routing it can replay (Mixtral, Qwen-MoE); the message says why"
            " this one cannot",
        ),
        ErrorCode(
            "router_replay_mismatch",
            400,
            "the named routes do not fit the batch: another count of rows, other tokens, a longer row or another"
            " base model than the one that sampled them",
        ),
        ErrorCode(
            "unknown_routes",
            400,
            "a `routes_id` names no routes this job holds (never recorded, or discarded); record them again",
        ),
        ErrorCode("unknown_loss", 400, "loss_fn names no loss this backend has"),
        ErrorCode(
            "custom_loss_refused",
            400,
            "a custom loss graph breaks a rule of the allow-list (docs/tinker.md); `detail.node` names the node",
        ),
        ErrorCode(
            "custom_loss_failed",
            None,
            "a custom loss raised while it ran on the trainer (or grew past its size bound); the message names"
            " the node",
            (REQUEST,),
            category=USER_ERROR,
        ),
        ErrorCode("unknown_model", 400, "base_model names no registered model (GET /v1/models lists them)"),
        ErrorCode("invalid_model_name", 400, "base_model is not a model name (a path or URL, say)"),
        ErrorCode("too_many_training_sub_jobs", 400, "a job has at most one training sub-job"),
        ErrorCode(
            "unsupported_operation", 400, "the sub-job (or model) does not serve this operation", (REQUEST,)
        ),
        ErrorCode(
            "sandbox_unavailable",
            400,
            "this backend has no run sandbox (bubblewrap is not installed or cannot run) and was not started"
            " with --allow-unsandboxed-runs; the message says how to install it",
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
        ErrorCode(
            "multi_gpu_sampling_unsupported",
            400,
            "a log-probability sub-job asked for n_gpus > 1, or a sampling one on a backend whose devices"
            " do not sample with vLLM: sampling across devices is vLLM's tensor parallelism",
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
            "priority_not_allowed",
            403,
            "the token may not ask this queue priority; `detail.max_priority` is the highest it may",
        ),
        ErrorCode(
            "download_link_invalid",
            403,
            "a signed download URL whose signature does not match or whose time has passed; ask for new URLs",
        ),
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
        ErrorCode(
            "managed_run_busy",
            409,
            "the job is a training run whose loop is training: a load would race it; start a"
            " run with `init_from` instead, or load once the loop has ended",
        ),
        ErrorCode(
            "too_many_sessions",
            409,
            "the owner holds as many live Tinker sessions (or a session as many clients) as the backend"
            " allows; close one, or let it expire",
        ),
        ErrorCode(
            "router_replay_cache_full",
            409,
            "the routes kept for replay would pass the job's cap; discard routes already trained on, or raise"
            " the cap",
            (REQUEST,),
        ),
        ErrorCode(
            "checkpoint_in_use",
            409,
            "a load or export reads the checkpoint; delete it after",
            category=RETRYABLE,
        ),
        ErrorCode("checkpoint_exists", 409, "the job already has a checkpoint with this id"),
        ErrorCode(
            "checkpoint_publication_unchanged",
            409,
            "publish of a checkpoint already public, or unpublish of one already private",
        ),
        ErrorCode(
            "checkpoint_kept",
            409,
            "the checkpoint is marked keep: un-keep it (PATCH kept false) before deleting it or its job",
        ),
        ErrorCode(
            "job_not_finished", 409, "the job is still going; cancel or complete it before deleting it"
        ),
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
            "storage_unavailable",
            503,
            "the backend's store refused writes (its disk is full, or another process holds its database"
            " lock); an answer: retry shortly. A job: it failed after retrying, keeping what was recorded",
            (JOB,),
        ),
        ErrorCode(
            "insufficient_storage",
            507,
            "the backend's disk is full; nothing was kept. Free space in its data dir and retry",
        ),
        ErrorCode(
            "too_many_connections",
            503,
            "the backend has as many connections open as it allows (--max-connections); retry shortly",
        ),
        ErrorCode(
            "backend_draining",
            503,
            "the backend is stopping (SIGTERM, `cortex-nb backend stop`) and admits no new work;"
            " retry once it is back: its training runs resume by themselves",
        ),
        ErrorCode("proxy_not_configured", 501, "the Jupyter server has no backend token to forward with"),
        ErrorCode(
            "not_supported",
            501,
            "a compatibility face was asked for something that cannot exist here;"
            " the message names the cortex-nb way to do it",
        ),
        ErrorCode("backend_unavailable", 502, "the backend does not answer"),
        ErrorCode(
            "version_mismatch",
            502,
            "the backend speaks another API major version",
            (CLIENT,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "reply_mismatch",
            None,
            "a backend's answer does not match its route's schema (client and backend versions differ)",
            (CLIENT,),
            category=INTERNAL,
        ),
        # ends of jobs, requests and runs
        ErrorCode("cancelled", None, "cancelled by the user", (JOB, REQUEST, RUN), category=USER_ERROR),
        ErrorCode(
            "backend_restarted",
            None,
            "the backend restarted while this was in flight",
            (JOB, REQUEST, RUN),
            category=RETRYABLE,
        ),
        ErrorCode(
            "worker_crashed",
            None,
            "the worker process serving the sub-job died",
            (JOB, REQUEST),
            category=RETRYABLE,
        ),
        ErrorCode(
            "worker_start_failed",
            None,
            "the worker could not load the model or start",
            (JOB,),
            category=INTERNAL,
        ),
        ErrorCode(
            "adapter_host_full",
            None,
            "the slot's adapter, gradients and optimizer state could never fit on its adapter host, not even"
            " beside the base alone (its --adapter-host-memory budget, or the device's memory); the message"
            " gives the bytes. A slot that fits once other slots end waits in the queue instead",
            (JOB,),
            category=USER_ERROR,
        ),
        ErrorCode("out_of_memory", None, "the device ran out of memory", (JOB, REQUEST), category=USER_ERROR),
        ErrorCode(
            "host_lost",
            None,
            "the host running the sub-job left the cluster (its node died or was removed)",
            (JOB,),
            category=RETRYABLE,
        ),
        ErrorCode(
            "operation_failed",
            None,
            "the operation raised an error; see the message",
            (REQUEST,),
            category=INTERNAL,
        ),
        ErrorCode(
            "no_gradients",
            None,
            "step found no gradients to apply: call forward_backward first",
            (REQUEST,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "non_finite_gradients",
            None,
            "a step's gradient norm was NaN or infinite; lower the learning rate or clip gradients",
            (JOB, REQUEST),
            category=USER_ERROR,
        ),
        ErrorCode(
            "training_loop_failed",
            None,
            "the managed training loop raised an error; see the message and the job's logs",
            (JOB,),
            category=INTERNAL,
        ),
        ErrorCode(
            "restore_failed",
            None,
            "a parked training client could not be brought back from its saved state; load checkpoint"
            " 'parked' into a new one",
            (JOB, REQUEST),
            category=INTERNAL,
        ),
        ErrorCode(
            "weight_sync_failed",
            None,
            "a sampler could not take the trainer's weights; it kept its previous ones",
            (REQUEST,),
            category=INTERNAL,
        ),
        ErrorCode(
            "weight_sync_timeout",
            None,
            "a weight-sync participant did not answer in time",
            (REQUEST,),
            category=RETRYABLE,
        ),
        # source runs (docs/run-spec.md)
        ErrorCode(
            "workload_runtime_failed",
            None,
            "the command exited non-zero or was killed by a signal; see exit_code and the logs",
            (RUN,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "workload_out_of_memory",
            None,
            "the workload ran out of memory (the run's memory limit, its address-space limit, or the device's)",
            (RUN,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "disk_quota_exceeded",
            None,
            "the run's work dir passed its quota (--run-disk-mib) and the run was stopped",
            (RUN,),
            category=USER_ERROR,
        ),
        ErrorCode("output_missing", None, "a required output was not written", (RUN,), category=USER_ERROR),
        ErrorCode(
            "output_too_large", None, "an output is larger than its max_bytes", (RUN,), category=USER_ERROR
        ),
        ErrorCode(
            "timed_out",
            None,
            "the run passed its timeout_seconds and was stopped",
            (RUN,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "isolation_unsupported",
            None,
            "isolation: required, and this host cannot give the run its sandbox or per-run limits",
            (RUN,),
            category=NOT_SUPPORTED,
        ),
        ErrorCode(
            "script_refused",
            None,
            "the script gate (--run-script-gate strict) found what the operator's policy forbids, or a"
            " file it cannot parse; the run's report lists the findings",
            (RUN,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "sandbox_failed",
            None,
            "the backend could not set up the run's sandbox; see the message",
            (RUN,),
            category=INTERNAL,
        ),
        # raised by the client itself
        ErrorCode(
            "timeout",
            None,
            "waiting locally ran out of time; the remote request, job or run keeps going",
            (CLIENT,),
            category=RETRYABLE,
        ),
        ErrorCode(
            "submission_outcome_unknown",
            None,
            "a run was submitted and no answer came back; resume it by its submission id",
            (CLIENT,),
            category=RETRYABLE,
        ),
        ErrorCode(
            "local_dir_unsafe",
            None,
            "the local backend's state dir is not the user's own or is open to others (it must be 0700)",
            (CLIENT,),
            category=USER_ERROR,
        ),
        ErrorCode(
            "output_corrupted",
            None,
            "a downloaded run output does not match its recorded length or SHA-256",
            (CLIENT,),
            category=RETRYABLE,
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


def category_of(code: str | None) -> str:
    """A code's category; an unknown code (or none) is the backend's fault, never silently the user's."""
    entry = ERROR_CODES.get(code or "")
    return entry.category if entry is not None else INTERNAL


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

    @property
    def retryable(self) -> bool:
        """Would the same call (or, for a request lost in a restart, the same request submitted again)
        succeed once the backend is back? True for the codes of a backend that went away for a while."""
        return self.code in RETRYABLE_CODES


# Codes that say "the backend was busy, away or stopping", not "this was wrong": submit again later.
RETRYABLE_CODES = frozenset(code for code, entry in ERROR_CODES.items() if entry.category == RETRYABLE)


class ApiError(CortexError):
    """Raised inside the backend: rendered as `{"error": {code, message, detail}}` with the code's status."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code, status=status_for(code), detail=detail)
