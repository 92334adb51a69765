"""The backend's REST routes: one table read by the backend (to serve, validate and render), the client
(to build URLs), the Jupyter proxy (its allowlist), the OpenAPI document (`openapi.py`) and the sidebar
panel (a generated copy checked by a test).

A route is its name, method, template and scope, plus what it takes and answers: its query parameters
(a `Query` model), its body (a `Body` model, or raw `Content`), its reply (a `Reply` model, or raw
`Content`) with its success status, and the error codes it can answer with besides those every route
shares. Templates use `{name}` placeholders that match one path segment. `scope` is the token scope
needed; None means no authentication (only `/version`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from urllib.parse import quote

from pydantic import BaseModel

from . import wire
from .schemas import (
    checkpoints,
    data_plane,
    datasets,
    jobs,
    logs,
    meta,
    observability,
    runs,
    speedtest,
    stats,
    telemetry,
)

READ = "jobs:read"
WRITE = "jobs:write"
RUNS = "runs:write"
ADMIN = "admin"
SCOPES = (READ, WRITE, RUNS, ADMIN)


@dataclass(frozen=True)
class Content:
    """A body that is not a JSON object of ours: a tensor frame, JSONL, a tar, a stream of records."""

    media_type: str
    description: str
    optional: bool = False  # a request body that may be absent (a frame sent as chunks comes by reference)


FRAME = Content(
    wire.FRAME_CONTENT_TYPE,
    "a tensor frame (docs/wire.md); absent when the frame was uploaded as"
    " chunks and is named by the X-Cortex-Upload and X-Cortex-Upload-Sha256 headers",
    optional=True,
)
CHUNK = Content(
    "application/octet-stream", "one chunk, with X-Cortex-Chunk-Sha256 and X-Cortex-Chunk-Count headers"
)
JSONL = Content("application/x-ndjson", 'JSONL rows: {"text"} or {"prompt", "completion"} per line')
TAR = Content("application/x-tar", "the export manifest first, then the files it lists")
BYTES = Content(
    "application/octet-stream", "the output's bytes as collected (X-Cortex-Sha256 carries their SHA-256)"
)
TENSORS = Content(
    wire.FRAME_CONTENT_TYPE, "the result's tensors as a frame (X-Cortex-Sha256 carries its SHA-256)"
)
PROMETHEUS = Content("text/plain", "Prometheus text exposition")
OPENAPI = Content("application/json", "this document")
Body = type[BaseModel] | Content | None


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    template: str
    scope: str | None
    # Whether the Jupyter server proxy forwards this route for the browser and kernels.
    proxied: bool = True
    summary: str = ""
    query: type[BaseModel] | None = None
    body: Body = None
    reply: Body = None
    status: int = 200
    errors: tuple[str, ...] = ()
    # A reply in another form on request (e.g. a followed log stream), beside `reply`.
    stream: Content | None = None
    # What a success reply leads to: (route name, {its path parameter: where in this reply it is}), the
    # OpenAPI links a client (or a stateful fuzzer) follows from one call to the next.
    links: tuple[tuple[str, dict[str, str]], ...] = ()

    @property
    def regex(self) -> str:
        """Tornado URL pattern with named groups for the placeholders."""
        return _regex(self.template)

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.template)

    def url(self, **params: str) -> str:
        """Fill the placeholders, quoting each value as one path segment."""
        return re.sub(r"\{(\w+)\}", lambda m: quote(str(params[m.group(1)]), safe=""), self.template)


def follow(names: tuple[str, ...], **parameters: str) -> tuple[tuple[str, dict[str, str]], ...]:
    """Links from a reply to each of `names`, filling their path parameters from the reply's body."""
    return tuple(
        (name, {key: f"$response.body#/{where}" for key, where in parameters.items()}) for name in names
    )


# Routes of one job, and of one request, that a stateful client reaches from a job or request it made.
JOB_ROUTES = (
    "get_job",
    "cancel_job",
    "complete_job",
    "step",
    "generate",
    "noop",
    "reset_prefix_cache",
    "router_replay_discard",
    "save",
    "load",
    "weight_sync",
    "list_requests",
    "list_checkpoints",
    "job_lineage",
    "job_logs",
    "job_metrics",
)
REQUEST_ROUTES = ("get_request", "cancel_request", "get_request_tensors")
CHECKPOINT_ROUTES = ("get_checkpoint", "export_checkpoint", "update_checkpoint", "delete_checkpoint")
TO_JOB = follow(JOB_ROUTES, job_id="job_id")
# What a forward_backward or forward naming recorded routes can be refused with (docs/router-replay.md).
REPLAY = ("router_replay_unsupported", "router_replay_mismatch", "unknown_routes")
TO_REQUEST = follow(REQUEST_ROUTES, job_id="job_id", request_id="request_id")
RUN_ROUTES = ("get_run", "cancel_run", "run_logs", "run_report", "list_run_outputs")
TO_RUN = follow(RUN_ROUTES, run_id="run_id")

# Error codes a kind of route can answer with, besides the ones it names itself.
JOB = ("job_not_found",)
SUBMIT = (
    *JOB,
    "job_finished",
    "unsupported_operation",
    "idempotency_key_reused",
    "invalid_request",
    "backend_draining",
)
# a generate or forward run with a saved adapter (`adapter`) instead of the live one
SAVED_ADAPTER = (
    "checkpoint_not_found",
    "invalid_checkpoint_id",
    "incompatible_adapter",
    "checkpoint_corrupted",
)
RUN = ("run_not_found",)
CHUNKED = ("invalid_request", "invalid_field", "chunk_mismatch", "not_found", "conflict", "quota_exceeded")

ROUTES: tuple[Route, ...] = (
    Route(
        "version",
        "GET",
        "/version",
        None,
        summary="service, version and API version (no authentication); with ?challenge=, the local backend's proof",
        query=meta.VersionQuery,
        reply=meta.Version,
    ),
    Route(
        "openapi",
        "GET",
        "/v1/openapi.json",
        None,
        proxied=False,
        summary="this API as an OpenAPI 3.1 document",
        reply=OPENAPI,
    ),
    # jobs
    Route(
        "create_job",
        "POST",
        "/v1/jobs",
        WRITE,
        summary="create a job (queued until its devices are free)",
        body=jobs.CreateJob,
        reply=jobs.JobView,
        status=201,
        links=TO_JOB,
        errors=(
            "unknown_model",
            "invalid_model_name",
            "too_many_training_sub_jobs",
            "exceeds_capacity",
            "multi_gpu_sampling_unsupported",
            "conflict",
            "dataset_not_found",
            "spec_invalid",
            "idempotency_key_reused",
            "job_id_unavailable",
            "no_host_for_model",
            "priority_not_allowed",
            "checkpoint_not_found",
            "backend_draining",
        ),
    ),
    Route(
        "list_jobs",
        "GET",
        "/v1/jobs",
        READ,
        summary="the caller's jobs (an admin's: everyone's), newest first, filtered by name, state, time,"
        " label or owner",
        query=jobs.ListJobsQuery,
        reply=jobs.JobPage,
    ),
    Route(
        "get_job",
        "GET",
        "/v1/jobs/{job_id}",
        READ,
        summary="a job, optionally after waiting for a change",
        query=jobs.GetJobQuery,
        reply=jobs.JobView,
        errors=JOB,
    ),
    Route(
        "cancel_job",
        "POST",
        "/v1/jobs/{job_id}/cancel",
        WRITE,
        summary="stop a job now (idempotent)",
        reply=jobs.JobView,
        errors=JOB,
    ),
    Route(
        "complete_job",
        "POST",
        "/v1/jobs/{job_id}/complete",
        WRITE,
        summary='free a job\'s device once its queued requests ran ("Free device")',
        reply=jobs.CompletedJob,
        errors=(*JOB, "job_finished"),
    ),
    Route(
        "update_job",
        "PATCH",
        "/v1/jobs/{job_id}",
        WRITE,
        summary="rename a job, or replace its labels (tags)",
        body=jobs.UpdateJob,
        reply=jobs.JobView,
        errors=(*JOB, "invalid_request"),
    ),
    Route(
        "delete_job",
        "DELETE",
        "/v1/jobs/{job_id}",
        WRITE,
        summary="forget a finished job: its record, logs and checkpoints (refused while it runs or keeps one)",
        reply=jobs.DeletedJob,
        errors=(*JOB, "job_not_finished", "checkpoint_kept", "checkpoint_in_use"),
    ),
    Route(
        "job_lineage",
        "GET",
        "/v1/jobs/{job_id}/lineage",
        READ,
        summary="job → step → checkpoint → exports, loads and samplings; the job's weight syncs",
        reply=checkpoints.JobLineage,
        errors=JOB,
    ),
    # data plane: each answers 202 {request_id}
    Route(
        "forward_backward",
        "POST",
        "/v1/jobs/{job_id}/forward_backward",
        WRITE,
        summary="forward and backward pass; gradients accumulate until step",
        query=data_plane.OperationQuery,
        body=FRAME,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(
            *SUBMIT,
            "invalid_frame",
            "invalid_batch",
            "unknown_loss",
            "chunk_mismatch",
            "not_found",
            "conflict",
            *REPLAY,
        ),
    ),
    Route(
        "step",
        "POST",
        "/v1/jobs/{job_id}/step",
        WRITE,
        summary="apply the accumulated gradients (AdamW)",
        query=data_plane.OperationQuery,
        body=data_plane.StepBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=SUBMIT,
    ),
    Route(
        "generate",
        "POST",
        "/v1/jobs/{job_id}/generate",
        WRITE,
        summary="sample from prompts",
        query=data_plane.OperationQuery,
        body=data_plane.GenerateBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(
            *SUBMIT,
            "invalid_batch",
            *SAVED_ADAPTER,
            "router_replay_unsupported",
            "router_replay_cache_full",
        ),
        stream=Content(
            "text/event-stream",
            "with `stream: true`: server-sent events `submitted`, `tokens` ({samples: [{prompt_index,"
            " sample_index, tokens, logprobs, text}]}) as they are decoded, and a last `result` (RequestStatus)",
        ),
    ),
    Route(
        "forward",
        "POST",
        "/v1/jobs/{job_id}/forward",
        WRITE,
        summary="log-probabilities of targets, no gradients",
        query=data_plane.OperationQuery,
        body=FRAME,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(
            *SUBMIT,
            "invalid_frame",
            "invalid_batch",
            "chunk_mismatch",
            "not_found",
            "conflict",
            "unknown_loss",
            *SAVED_ADAPTER,
            *REPLAY,
        ),
    ),
    Route(
        "noop",
        "POST",
        "/v1/jobs/{job_id}/noop",
        WRITE,
        summary="a request that does nothing in the worker",
        query=data_plane.OperationQuery,
        body=data_plane.NoopBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=SUBMIT,
    ),
    Route(
        "reset_prefix_cache",
        "POST",
        "/v1/jobs/{job_id}/reset_prefix_cache",
        WRITE,
        summary="drop the sampling engine's cached prompt prefixes, after the sub-job's queued requests",
        query=data_plane.OperationQuery,
        body=data_plane.ResetPrefixCacheBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=SUBMIT,
    ),
    Route(
        "router_replay_discard",
        "POST",
        "/v1/jobs/{job_id}/router_replay/discard",
        WRITE,
        summary="free MoE routes recorded for replay (generate's `record_routes`): the named ones, or all",
        body=data_plane.RouterReplayDiscardBody,
        reply=data_plane.RouterReplayDiscarded,
        errors=JOB,
    ),
    Route(
        "list_requests",
        "GET",
        "/v1/jobs/{job_id}/requests",
        READ,
        summary="a job's requests, newest first",
        query=data_plane.ListRequestsQuery,
        reply=data_plane.RequestList,
        errors=JOB,
    ),
    Route(
        "get_request",
        "GET",
        "/v1/jobs/{job_id}/requests/{request_id}",
        READ,
        summary="a request's status, events and result",
        query=data_plane.GetRequestQuery,
        reply=data_plane.RequestStatus,
        errors=(*JOB, "request_not_found"),
        links=follow(CHECKPOINT_ROUTES, job_id="job_id", checkpoint_id="result/checkpoint_id"),
    ),
    Route(
        "get_request_tensors",
        "GET",
        "/v1/jobs/{job_id}/requests/{request_id}/tensors",
        READ,
        summary="a succeeded request's result tensors",
        reply=TENSORS,
        errors=(*JOB, "request_not_found", "not_found"),
    ),
    Route(
        "cancel_request",
        "POST",
        "/v1/jobs/{job_id}/requests/{request_id}/cancel",
        WRITE,
        summary="cancel a queued request, or ask a running one to stop",
        reply=data_plane.RequestStatus,
        errors=(*JOB, "request_not_found"),
    ),
    # checkpoints and weight sync: save, load and weight_sync answer 202 {request_id} like the data plane
    Route(
        "save",
        "POST",
        "/v1/jobs/{job_id}/save",
        WRITE,
        summary="save the trainer as a checkpoint",
        query=data_plane.OperationQuery,
        body=data_plane.SaveBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(*SUBMIT, "invalid_checkpoint_id", "checkpoint_exists", "quota_exceeded"),
    ),
    Route(
        "load",
        "POST",
        "/v1/jobs/{job_id}/load",
        WRITE,
        summary="load a checkpoint into a sub-job",
        query=data_plane.OperationQuery,
        body=data_plane.LoadBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(
            *SUBMIT,
            "invalid_checkpoint_id",
            "checkpoint_not_found",
            "incompatible_adapter",
            "managed_run_busy",
        ),
    ),
    Route(
        "weight_sync",
        "POST",
        "/v1/jobs/{job_id}/weight_sync",
        WRITE,
        summary="send the trainer's weights to its samplers",
        query=data_plane.OperationQuery,
        body=data_plane.WeightSyncBody,
        reply=data_plane.Submitted,
        status=202,
        links=TO_REQUEST,
        errors=(*SUBMIT, "incompatible_adapter"),
    ),
    Route(
        "list_checkpoints",
        "GET",
        "/v1/jobs/{job_id}/checkpoints",
        READ,
        summary="a job's valid checkpoints, filtered by type, kept, step or time",
        query=checkpoints.ListCheckpointsQuery,
        reply=checkpoints.CheckpointList,
        errors=JOB,
        links=follow(CHECKPOINT_ROUTES, job_id="job_id", checkpoint_id="checkpoints/0/checkpoint_id"),
    ),
    Route(
        "prune_checkpoints",
        "POST",
        "/v1/jobs/{job_id}/prune_checkpoints",
        WRITE,
        summary="delete a job's checkpoints in bulk: all but `final` and the kept ones, or those older than",
        body=checkpoints.PruneCheckpoints,
        reply=checkpoints.PrunedCheckpoints,
        errors=JOB,
    ),
    Route(
        "get_checkpoint",
        "GET",
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}",
        READ,
        summary="one checkpoint",
        reply=checkpoints.CheckpointView,
        errors=(*JOB, "checkpoint_not_found", "invalid_checkpoint_id"),
    ),
    Route(
        "update_checkpoint",
        "PATCH",
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}",
        WRITE,
        summary="set a checkpoint's TTL (or none), publish or unpublish it, mark it keep or take the mark off",
        body=checkpoints.CheckpointUpdate,
        reply=checkpoints.CheckpointView,
        errors=(
            *JOB,
            "checkpoint_not_found",
            "invalid_checkpoint_id",
            "invalid_field",
            "checkpoint_publication_unchanged",
        ),
    ),
    Route(
        "copy_checkpoint",
        "POST",
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/copy",
        WRITE,
        summary="copy a checkpoint you may read (yours, or a published one) into a new job of yours",
        body=checkpoints.CheckpointCopy,
        reply=checkpoints.CheckpointView,
        status=201,
        errors=("checkpoint_not_found", "invalid_checkpoint_id", "invalid_field", "quota_exceeded"),
    ),
    Route(
        "storage",
        "GET",
        "/v1/storage",
        READ,
        summary="bytes of checkpoints per owner (against the quota), per job",
        query=checkpoints.StorageQuery,
        reply=checkpoints.StorageView,
        errors=("forbidden",),
    ),
    Route(
        "delete_checkpoint",
        "DELETE",
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}",
        WRITE,
        summary="delete a checkpoint (refused while a load or export reads it)",
        reply=checkpoints.DeletedCheckpoint,
        errors=(
            *JOB,
            "checkpoint_not_found",
            "invalid_checkpoint_id",
            "checkpoint_in_use",
            "checkpoint_kept",
            "idempotency_key_reused",
        ),
    ),
    Route(
        "export_checkpoint",
        "GET",
        "/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export",
        READ,
        summary="a checkpoint as a tar, every file checked first",
        query=checkpoints.ExportQuery,
        reply=TAR,
        errors=(*JOB, "checkpoint_not_found", "invalid_checkpoint_id", "checkpoint_corrupted"),
    ),
    # managed training: datasets uploaded once, named by their SHA-256
    Route(
        "put_dataset",
        "PUT",
        "/v1/datasets/{dataset_id}",
        WRITE,
        summary="upload a dataset (id = its SHA-256)",
        body=JSONL,
        reply=datasets.DatasetView,
        errors=("hash_mismatch", "invalid_dataset", "invalid_field", "body_too_large", "quota_exceeded"),
        links=follow(("get_dataset",), dataset_id="dataset_id"),
    ),
    Route(
        "get_dataset",
        "GET",
        "/v1/datasets/{dataset_id}",
        READ,
        summary="whether the backend has a dataset",
        reply=datasets.DatasetView,
        errors=("dataset_not_found", "invalid_field"),
    ),
    # chunked uploads for large frames
    Route(
        "upload_chunk",
        "PUT",
        "/v1/uploads/{upload_id}/chunks/{index}",
        WRITE,
        summary="one chunk of a large frame",
        body=CHUNK,
        reply=data_plane.ChunkStored,
        errors=(*CHUNKED, "body_too_large"),
    ),
    # logs
    Route(
        "job_logs",
        "GET",
        "/v1/jobs/{job_id}/logs",
        READ,
        summary="a page of log lines after a cursor, or (follow=1) a stream until the job ends",
        query=logs.JobLogsQuery,
        reply=logs.JobLogPage,
        errors=JOB,
        stream=Content(
            "application/x-ndjson", "one JSON record per line: type line, dropped, heartbeat or end"
        ),
    ),
    # host and models
    Route(
        "capacity",
        "GET",
        "/v1/capacity",
        READ,
        summary="devices, slots in use and the queue",
        reply=meta.Capacity,
    ),
    Route(
        "list_models",
        "GET",
        "/v1/models",
        READ,
        summary="the models a sub-job may name",
        reply=meta.ModelList,
    ),
    Route(
        "tokenize",
        "POST",
        "/v1/models/{model}/tokenize",
        READ,
        summary="texts to token ids with a model's tokenizer",
        body=meta.TokenizeBody,
        reply=meta.Tokenized,
        errors=("unknown_model", "invalid_model_name", "unsupported_operation"),
    ),
    Route(
        "detokenize",
        "POST",
        "/v1/models/{model}/detokenize",
        READ,
        summary="token ids to texts",
        body=meta.DetokenizeBody,
        reply=meta.Detokenized,
        errors=("unknown_model", "invalid_model_name", "unsupported_operation"),
    ),
    # source runs: a user's own code on the backend host, with verified outputs (docs/run-spec.md)
    Route(
        "create_run",
        "POST",
        "/v1/runs",
        RUNS,
        summary="submit a source run (a submission id runs once)",
        body=runs.CreateRun,
        reply=runs.RunView,
        status=201,
        links=TO_RUN,
        errors=(
            "spec_invalid",
            "manifest_mismatch",
            "exceeds_capacity",
            "unknown_model",
            "chunk_mismatch",
            "not_found",
            "conflict",
            "unsupported_operation",
            "sandbox_unavailable",
            "priority_not_allowed",
        ),
    ),
    Route(
        "list_runs",
        "GET",
        "/v1/runs",
        READ,
        summary="the caller's runs (an admin's: everyone's), newest first, filtered by name, state, time,"
        " label or owner",
        query=runs.ListRunsQuery,
        reply=runs.RunPage,
    ),
    Route(
        "get_run",
        "GET",
        "/v1/runs/{run_id}",
        READ,
        summary="a run, optionally after waiting for a change",
        query=runs.GetRunQuery,
        reply=runs.RunView,
        errors=RUN,
    ),
    Route(
        "cancel_run",
        "POST",
        "/v1/runs/{run_id}/cancel",
        RUNS,
        summary="stop a run",
        reply=runs.RunView,
        errors=RUN,
    ),
    Route(
        "run_logs",
        "GET",
        "/v1/runs/{run_id}/logs",
        READ,
        summary="a page of a run's log lines",
        query=logs.RunLogsQuery,
        reply=logs.RunLogPage,
        errors=RUN,
    ),
    Route(
        "run_report",
        "GET",
        "/v1/runs/{run_id}/report",
        READ,
        summary="what a run used",
        reply=runs.RunReport,
        errors=RUN,
    ),
    Route(
        "list_run_outputs",
        "GET",
        "/v1/runs/{run_id}/outputs",
        READ,
        summary="a run's declared outputs",
        reply=runs.RunOutputs,
        errors=RUN,
    ),
    Route(
        "get_run_output",
        "GET",
        "/v1/runs/{run_id}/outputs/{name}",
        READ,
        summary="one output's bytes",
        reply=BYTES,
        errors=(*RUN, "output_not_declared", "output_not_available"),
    ),
    Route(
        "upload_run_chunk",
        "PUT",
        "/v1/runs/uploads/{upload_id}/chunks/{index}",
        RUNS,
        summary="one chunk of a run's source archive",
        body=CHUNK,
        reply=data_plane.ChunkStored,
        errors=(*CHUNKED, "body_too_large"),
    ),
    # tokens: never through the proxy
    Route(
        "whoami",
        "GET",
        "/v1/whoami",
        READ,
        proxied=False,
        summary="the token's owner and scopes",
        reply=meta.WhoAmI,
    ),
    # observability: device metrics, the event feed, client telemetry, operator metrics
    Route(
        "job_metrics",
        "GET",
        "/v1/jobs/{job_id}/metrics",
        READ,
        summary="a job's device samples",
        query=observability.JobMetricsQuery,
        reply=observability.JobMetrics,
        errors=JOB,
    ),
    Route(
        "host_metrics",
        "GET",
        "/v1/host/metrics",
        READ,
        summary="the newest sample of each device",
        query=observability.HostMetricsQuery,
        reply=observability.HostMetrics,
    ),
    Route(
        "list_events",
        "GET",
        "/v1/events",
        READ,
        summary="job and request state changes after a cursor",
        query=observability.EventsQuery,
        reply=observability.EventPage,
    ),
    Route(
        "stats",
        "GET",
        "/v1/stats",
        READ,
        summary="jobs and runs by state, queue wait and device-seconds per owner and model over a window",
        query=stats.StatsQuery,
        reply=stats.Stats,
    ),
    Route(
        "speedtest_download",
        "GET",
        "/v1/speedtest",
        READ,
        summary="the link speed test: N bytes to time a download (or 0, a round trip); a few per minute per token",
        query=speedtest.SpeedtestQuery,
        reply=Content("application/octet-stream", "`bytes` bytes of no meaning"),
        errors=("rate_limited",),
    ),
    Route(
        "speedtest_upload",
        "POST",
        "/v1/speedtest",
        READ,
        summary="the link speed test: a body of at most 32 MiB, counted and dropped; a few per minute per token",
        body=Content("application/octet-stream", "any bytes, at most 32 MiB"),
        reply=speedtest.SpeedtestReceived,
        errors=("rate_limited", "body_too_large"),
    ),
    Route(
        "client_telemetry",
        "POST",
        "/v1/telemetry",
        READ,
        summary="report client operations",
        body=telemetry.TelemetryBatch,
        reply=telemetry.TelemetryAccepted,
        status=202,
    ),
    Route(
        "recent_telemetry",
        "GET",
        "/v1/telemetry",
        ADMIN,
        proxied=False,
        summary="the last telemetry records",
        query=telemetry.RecentTelemetryQuery,
        reply=telemetry.TelemetryRecords,
    ),
    Route(
        "operator_metrics",
        "GET",
        "/metrics",
        READ,
        proxied=False,
        summary="operator metrics for Prometheus",
        reply=PROMETHEUS,
    ),
)

ROUTES_BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}


def route(name: str) -> Route:
    return ROUTES_BY_NAME[name]


@cache
def _regex(template: str) -> str:
    return "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$"


@cache
def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(_regex(template))


# Each table's routes grouped by method with their compiled patterns, built on a table's first lookup
# (every request looks its route up; the tables are constants). Keyed by identity, holding the table.
_BY_METHOD: dict[int, tuple[tuple[Route, ...], dict[str, list[tuple[Route, re.Pattern[str]]]]]] = {}


def _by_method(table: tuple[Route, ...]) -> dict[str, list[tuple[Route, re.Pattern[str]]]]:
    cached = _BY_METHOD.get(id(table))
    if cached is not None and cached[0] is table:
        return cached[1]
    grouped: dict[str, list[tuple[Route, re.Pattern[str]]]] = {}
    for candidate in table:
        grouped.setdefault(candidate.method, []).append((candidate, _pattern(candidate.template)))
    _BY_METHOD[id(table)] = (table, grouped)
    return grouped


def match(method: str, path: str, table: tuple[Route, ...] = ROUTES) -> tuple[Route, dict[str, str]] | None:
    """The route serving `method path`, with its placeholder values; None if no route does. `table` is this
    API's routes unless a compatibility face (backend/cortex_backend/compat) passes its own."""
    for candidate, pattern in _by_method(table).get(method, ()):
        found = pattern.match(path)
        if found:
            return candidate, found.groupdict()
    return None
