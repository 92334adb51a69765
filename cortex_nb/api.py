"""The route table bound to HTTP: one method of `Api` per route of `cortex_nb/protocol/routes.py`.

This is the only layer that builds requests (through `transport.py`); the objects users hold
(`TrainingJob`, `Sampler`, `RunHandle`, futures, log streams) call it, and `Client` is a façade over them.
Each method returns the route's reply as the JSON object the wire carries (the public API promises dicts:
`job["status"]`), typed as its reply model (`Annotated[dict, JobView]`), and checked against that model:

- by default cheaply: the reply is an object that has every field its model requires;
- with `CORTEX_STRICT_REPLIES=1` (the tests) fully: it validates as the model (every field's type and
  constraints). Fields the model does not know are read past, as the contract promises a client of an
  older minor version. A reply that does not match raises `ReplyMismatchError` naming route and field.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Annotated, Any, Protocol

import numpy as np
from pydantic import BaseModel, ValidationError

from . import errors
from .batching import as_batch
from .poll_policy import PollPolicy
from .protocol import wire
from .protocol.checkpoint_format import MANIFEST_SHA_HEADER
from .protocol.losses import LOSSES
from .protocol.routes import Route, route
from .protocol.schemas import (
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
from .protocol.schemas.base import explain, field_path
from .server_events import server_events
from .telemetry import Telemetry, recorded
from .transport import RetryPolicy, Transport

ENV_STRICT = "CORTEX_STRICT_REPLIES"

# What each method returns: the reply's JSON object, typed by the model that describes it.
VersionInfo = Annotated[dict[str, Any], meta.Version]
WhoAmI = Annotated[dict[str, Any], meta.WhoAmI]
Capacity = Annotated[dict[str, Any], meta.Capacity]
ModelList = Annotated[dict[str, Any], meta.ModelList]
Tokenized = Annotated[dict[str, Any], meta.Tokenized]
Detokenized = Annotated[dict[str, Any], meta.Detokenized]
JobRow = Annotated[dict[str, Any], jobs.JobView]
CompletedJob = Annotated[dict[str, Any], jobs.CompletedJob]
JobPage = Annotated[dict[str, Any], jobs.JobPage]
Submitted = Annotated[dict[str, Any], data_plane.Submitted]
RequestStatus = Annotated[dict[str, Any], data_plane.RequestStatus]
RequestList = Annotated[dict[str, Any], data_plane.RequestList]
ChunkStored = Annotated[dict[str, Any], data_plane.ChunkStored]
RouterReplayDiscarded = Annotated[dict[str, Any], data_plane.RouterReplayDiscarded]
CheckpointList = Annotated[dict[str, Any], checkpoints.CheckpointList]
CheckpointRow = Annotated[dict[str, Any], checkpoints.CheckpointView]
DeletedCheckpoint = Annotated[dict[str, Any], checkpoints.DeletedCheckpoint]
PrunedCheckpoints = Annotated[dict[str, Any], checkpoints.PrunedCheckpoints]
StorageView = Annotated[dict[str, Any], checkpoints.StorageView]
JobLineage = Annotated[dict[str, Any], checkpoints.JobLineage]
DeletedJob = Annotated[dict[str, Any], jobs.DeletedJob]
DatasetRow = Annotated[dict[str, Any], datasets.DatasetView]
JobLogPage = Annotated[dict[str, Any], logs.JobLogPage]
RunLogPage = Annotated[dict[str, Any], logs.RunLogPage]
RunRow = Annotated[dict[str, Any], runs.RunView]
RunPage = Annotated[dict[str, Any], runs.RunPage]
RunReport = Annotated[dict[str, Any], runs.RunReport]
RunOutputs = Annotated[dict[str, Any], runs.RunOutputs]
JobMetrics = Annotated[dict[str, Any], observability.JobMetrics]
HostMetrics = Annotated[dict[str, Any], observability.HostMetrics]
EventPage = Annotated[dict[str, Any], observability.EventPage]
TelemetryAccepted = Annotated[dict[str, Any], telemetry.TelemetryAccepted]
TelemetryRecords = Annotated[dict[str, Any], telemetry.TelemetryRecords]
Stats = Annotated[dict[str, Any], stats.Stats]
SpeedtestReceived = Annotated[dict[str, Any], speedtest.SpeedtestReceived]
# A streamed generate sends a heartbeat every 10 s of quiet: a read waiting this long means a dead connection.
STREAM_READ_TIMEOUT_S = 35.0
# The filters `GET /v1/jobs` and `GET /v1/runs` take besides status, limit and cursor.
LISTING_FILTERS = ("name", "since", "until", "label", "owner")


def _filters(filters: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(filters) - set(LISTING_FILTERS))
    if unknown:
        raise TypeError(f"unknown listing filter(s) {unknown}; use {list(LISTING_FILTERS)}")
    return dict(filters)


def strict_from_env() -> bool:
    return os.environ.get(ENV_STRICT, "") == "1"


# --- checking a reply against its route's model -------------------------------------------------------

# reply model -> the fields it requires, computed once per model
_REQUIRED: dict[type[BaseModel], frozenset[str]] = {}


def _required_fields(model: type[BaseModel]) -> frozenset[str]:
    found = _REQUIRED.get(model)
    if found is None:
        found = _REQUIRED[model] = frozenset(
            field.alias or name for name, field in model.model_fields.items() if field.is_required()
        )
    return found


def _mismatch(
    spec: Route, model: type[BaseModel], problem: str, field: str = ""
) -> errors.ReplyMismatchError:
    return errors.ReplyMismatchError(
        f"the backend's answer to {spec.name} ({spec.method} {spec.template}) does not match {model.__name__}:"
        f" {problem}. The client and the backend disagree on the contract: install the same cortex-nb"
        " version on both sides",
        code="reply_mismatch",
        detail={"route": spec.name, "model": model.__name__, **({"field": field} if field else {})},
    )


def check_reply(spec: Route, reply: Any, *, strict: bool = False) -> Any:
    """`reply` if it matches `spec`'s reply model, else `ReplyMismatchError`: cheaply (an object with
    every required field) unless `strict`, which validates it as the model."""
    model = spec.reply
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return reply
    if not strict:
        if type(reply) is dict and _required_fields(model) <= reply.keys():
            return reply
        if not isinstance(reply, dict):
            raise _mismatch(spec, model, f"expected a JSON object, got {type(reply).__name__}")
        missing = sorted(_required_fields(model) - reply.keys())
        raise _mismatch(spec, model, f"{missing[0]}: is required", missing[0])
    try:
        model.model_validate(reply)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        field = field_path(tuple(error["loc"]))
        raise _mismatch(
            spec, model, f"{field}: {explain(error)}" if field else explain(error), field
        ) from None
    return reply


class HasApi(Protocol):
    """Anything that holds an `Api` (a `Client`)."""

    api: Api


def api_of(owner: Api | HasApi) -> Api:
    """The `Api` of a `Client` (or the `Api` itself): what the objects above this layer call."""
    return owner if isinstance(owner, Api) else owner.api


class Api:
    """One backend's routes as methods. `poll` is how the objects above wait; frames larger than
    `max_body_bytes` travel as chunks of `chunk_bytes`."""

    def __init__(
        self,
        transport: Transport,
        *,
        poll: PollPolicy | None = None,
        telemetry: Telemetry | None = None,
        strict: bool | None = None,
    ) -> None:
        self.transport = transport
        self.url = transport.url
        self.poll = poll or PollPolicy()
        self.telemetry = telemetry
        self.strict = strict_from_env() if strict is None else strict
        self.max_body_bytes = wire.MAX_BODY_BYTES
        self.chunk_bytes = wire.CHUNK_BYTES
        # The last link speed test's figures (link_speed.py); uploads above the threshold show an ETA from it.
        self.measured_link: dict[str, float] | None = None
        self.eta_threshold_bytes = 64 * 1024 * 1024

    @property
    def retry(self) -> RetryPolicy:
        return self.transport.retry

    def __repr__(self) -> str:
        return f"<cortex_nb.Api {self.url}>"

    def call(
        self,
        name: str,
        path_params: Mapping[str, str] | None = None,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Send route `name` and return its checked JSON reply."""
        spec = route(name)
        path = spec.url(**path_params) if path_params else spec.template
        response = self.transport.request(
            spec.method,
            path,
            json=json,
            content=content,
            params=params,
            headers=headers,
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
        )
        return check_reply(spec, response.json(), strict=self.strict)

    def _raw(self, name: str, path_params: Mapping[str, str], **kwargs: Any) -> Any:
        """Send route `name` whose reply is not JSON; the transport's response."""
        spec = route(name)
        return self.transport.request(spec.method, spec.url(**path_params), **kwargs)

    # meta ----------------------------------------------------------------------------------------
    def version(self, challenge: str | None = None) -> VersionInfo:
        return self.call("version", params={"challenge": challenge} if challenge else None)

    def openapi(self) -> dict[str, Any]:
        return self._raw("openapi", {}).json()

    def whoami(self) -> WhoAmI:
        return self.call("whoami")

    def capacity(self) -> Capacity:
        return self.call("capacity")

    def list_models(self) -> ModelList:
        return self.call("list_models")

    def tokenize(self, model: str, texts: Sequence[str], add_special_tokens: bool = True) -> Tokenized:
        body = {"texts": list(texts), "add_special_tokens": add_special_tokens}
        return self.call("tokenize", {"model": model}, json=body)

    def detokenize(self, model: str, tokens: Sequence[Sequence[int]]) -> Detokenized:
        return self.call("detokenize", {"model": model}, json={"tokens": [list(row) for row in tokens]})

    def operator_metrics(self) -> str:
        """The Prometheus text (an admin or operator token)."""
        return self._raw("operator_metrics", {}).text

    # jobs ----------------------------------------------------------------------------------------
    @recorded("create_job")
    def create_job(
        self,
        sub_jobs: Sequence[Mapping[str, Any]],
        job_id: str | None = None,
        experiment: str | None = None,
        hardware: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        idle_timeout_s: float | None = None,
        training_loop: Mapping[str, Any] | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> JobRow:
        body = {
            "labels": dict(labels) if labels else None,
            "priority": priority,
            "sub_jobs": list(sub_jobs),
            "training_loop": training_loop,
            "job_id": job_id,
            "experiment": experiment,
            "hardware": hardware,
            "name": name,
            "idle_timeout_s": idle_timeout_s,
        }
        return self.call("create_job", json={key: value for key, value in body.items() if value is not None})

    @recorded("list_jobs")
    def list_jobs(
        self, status: str | None = None, limit: int = 100, cursor: str | None = None, **filters: Any
    ) -> JobPage:
        """`filters`: any of `LISTING_FILTERS` (name, since, until, label, owner)."""
        return self.call(
            "list_jobs", params={"status": status, "limit": limit, "cursor": cursor, **_filters(filters)}
        )

    @recorded("get_job")
    def get_job(
        self,
        job_id: str,
        *,
        wait_s: float | None = None,
        while_status: str | None = None,
        after_progress: float | None = None,
    ) -> JobRow:
        """The job; with `wait_s`, after its status leaves `while_status` or its progress record is newer
        than `after_progress` (or `wait_s` passes)."""
        params = {"wait": wait_s or None, "while_status": while_status, "after_progress": after_progress}
        return self.call(
            "get_job", {"job_id": job_id}, params=params, timeout_s=wait_s + 30 if wait_s else None
        )

    @recorded("cancel_job")
    def cancel_job(self, job_id: str) -> JobRow:
        return self.call("cancel_job", {"job_id": job_id})

    def update_job(
        self, job_id: str, *, name: str | None = None, labels: Mapping[str, str] | None = None
    ) -> JobRow:
        """Rename a job, or replace its labels (tags) whole."""
        body: dict[str, Any] = {"name": name, "labels": dict(labels) if labels is not None else None}
        return self.call(
            "update_job",
            {"job_id": job_id},
            json={key: value for key, value in body.items() if value is not None},
        )

    def delete_job(self, job_id: str) -> DeletedJob:
        """Forget a finished job with its logs and checkpoints (refused while it runs or keeps a checkpoint)."""
        return self.call("delete_job", {"job_id": job_id})

    def job_lineage(self, job_id: str) -> JobLineage:
        return self.call("job_lineage", {"job_id": job_id})

    @recorded("complete_job")
    def complete_job(self, job_id: str) -> CompletedJob:
        return self.call("complete_job", {"job_id": job_id})

    # data plane ----------------------------------------------------------------------------------
    def _submit_frame(self, name: str, job_id: str, frame: bytes, sub_job: str | None) -> Submitted:
        """A frame in the body, or (above `max_body_bytes`) uploaded as chunks and named by reference."""
        params = {"sub_job": sub_job}
        if len(frame) <= self.max_body_bytes:
            headers = {"Content-Type": wire.FRAME_CONTENT_TYPE}
            return self.call(name, {"job_id": job_id}, content=frame, params=params, headers=headers)
        upload_id = "up-" + uuid.uuid4().hex
        chunks = wire.split_chunks(frame, self.chunk_bytes)
        for chunk in chunks:
            self.upload_chunk(upload_id, chunk.index, chunk.data, len(chunks), chunk.sha256)
        headers = {wire.UPLOAD_HEADER: upload_id, wire.UPLOAD_SHA_HEADER: wire.sha256_hex(frame)}
        return self.call(name, {"job_id": job_id}, params=params, idempotency_key=upload_id, headers=headers)

    def upload_chunk(
        self, upload_id: str, index: int, data: bytes, count: int, sha256: str | None = None
    ) -> ChunkStored:
        """One chunk of a large frame (retried safely: its idempotency key is its place in the upload)."""
        headers = {
            wire.CHUNK_SHA_HEADER: sha256 or wire.sha256_hex(data),
            wire.CHUNK_COUNT_HEADER: str(count),
        }
        return self.call(
            "upload_chunk",
            {"upload_id": upload_id, "index": str(index)},
            content=data,
            headers=headers,
            idempotency_key=f"{upload_id}-{index}",
        )

    @recorded("forward_backward")
    def forward_backward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, float] | None = None,
        *,
        sub_job: str | None = None,
        router_replay: Sequence[str] | None = None,
        record_routes: bool = False,
    ) -> Submitted:
        if loss_fn not in LOSSES:
            raise errors.BadRequestError(
                f"loss_fn must be one of {sorted(LOSSES)}, got {loss_fn!r}", code="unknown_loss"
            )
        metadata = {"loss_fn": loss_fn, "loss_fn_config": dict(loss_fn_config or {})}
        metadata.update(_routing(router_replay, record_routes))
        frame = wire.encode_frame(as_batch(batch), metadata)
        return self._submit_frame("forward_backward", job_id, frame, sub_job)

    @recorded("forward")
    def forward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        *,
        adapter: str | Mapping[str, str] | None = None,
        loss_fn: str | None = None,
        loss_fn_config: Mapping[str, float] | None = None,
        sub_job: str | None = None,
        router_replay: Sequence[str] | None = None,
        record_routes: bool = False,
    ) -> Submitted:
        metadata: dict[str, Any] = _routing(router_replay, record_routes)
        if adapter is not None:
            metadata["adapter"] = adapter
        if loss_fn is not None:
            metadata.update(loss_fn=loss_fn, loss_fn_config=dict(loss_fn_config or {}))
        return self._submit_frame("forward", job_id, wire.encode_frame(as_batch(batch), metadata), sub_job)

    @recorded("step")
    def step(self, job_id: str, body: Mapping[str, Any], *, sub_job: str | None = None) -> Submitted:
        return self.call("step", {"job_id": job_id}, json=dict(body), params={"sub_job": sub_job})

    @recorded("generate")
    def generate(
        self,
        job_id: str,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        adapter: str | Mapping[str, str] | None = None,
        sub_job: str | None = None,
    ) -> Submitted:
        body: dict[str, Any] = {"prompts": list(prompts), "sampling_params": dict(sampling_params or {})}
        if adapter is not None:
            body["adapter"] = adapter
        return self.call("generate", {"job_id": job_id}, json=body, params={"sub_job": sub_job})

    @contextlib.contextmanager
    def generate_stream(
        self,
        job_id: str,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: Mapping[str, Any] | None = None,
        *,
        adapter: str | Mapping[str, str] | None = None,
        sub_job: str | None = None,
    ) -> Iterator[Iterator[tuple[str, Any]]]:
        """The streamed form of `generate`: its server-sent events as (name, data) pairs: `submitted`,
        `tokens`..., `result`. Leaving the block early closes the connection, which cancels the request."""
        body: dict[str, Any] = {
            "prompts": list(prompts),
            "sampling_params": dict(sampling_params or {}),
            "stream": True,
        }
        if adapter is not None:
            body["adapter"] = adapter
        spec = route("generate")
        with self.transport.stream(
            spec.method,
            spec.url(job_id=job_id),
            params={"sub_job": sub_job},
            json=body,
            timeout_s=STREAM_READ_TIMEOUT_S,
        ) as response:
            yield server_events(response.iter_lines())

    def router_replay_discard(
        self, job_id: str, routes_ids: Sequence[str] | None = None
    ) -> RouterReplayDiscarded:
        body = {"routes_ids": list(routes_ids)} if routes_ids is not None else {}
        return self.call("router_replay_discard", {"job_id": job_id}, json=body)

    def reset_prefix_cache(self, job_id: str, *, sub_job: str | None = None) -> Submitted:
        return self.call("reset_prefix_cache", {"job_id": job_id}, json={}, params={"sub_job": sub_job})

    def noop(self, job_id: str, *, sub_job: str | None = None) -> Submitted:
        return self.call("noop", {"job_id": job_id}, json={}, params={"sub_job": sub_job})

    # requests ------------------------------------------------------------------------------------
    def list_requests(self, job_id: str, limit: int = 100) -> RequestList:
        return self.call("list_requests", {"job_id": job_id}, params={"limit": limit})

    def get_request(
        self, job_id: str, request_id: str, cursor: int = 0, wait_s: float = 0.0
    ) -> RequestStatus:
        return self.call(
            "get_request",
            {"job_id": job_id, "request_id": request_id},
            params={"cursor": cursor, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def get_request_tensors(self, job_id: str, request_id: str) -> dict[str, np.ndarray]:
        """A succeeded request's result tensors, their SHA-256 checked."""
        response = self._raw("get_request_tensors", {"job_id": job_id, "request_id": request_id})
        data = response.content
        expected = response.headers.get("X-Cortex-Sha256")
        if expected and wire.sha256_hex(data) != expected:
            raise errors.BackendError(
                "the result tensors arrived corrupted (SHA-256 mismatch); retry the poll",
                code="chunk_mismatch",
            )
        tensors, _ = wire.decode_frame(data)
        return tensors

    @recorded("cancel_request")
    def cancel_request(self, job_id: str, request_id: str) -> RequestStatus:
        return self.call("cancel_request", {"job_id": job_id, "request_id": request_id})

    # checkpoints and weight sync -----------------------------------------------------------------
    def save(
        self,
        job_id: str,
        checkpoint_id: str | None = None,
        checkpoint_type: str = "resumable",
        *,
        sub_job: str | None = None,
        ttl_seconds: int | None = None,
    ) -> Submitted:
        body: dict[str, Any] = {"type": checkpoint_type}
        if checkpoint_id is not None:
            body["checkpoint_id"] = checkpoint_id
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return self.call("save", {"job_id": job_id}, json=body, params={"sub_job": sub_job})

    def load(
        self,
        job_id: str,
        checkpoint_id: str,
        source_job_id: str | None = None,
        target_sub_job_id: str | None = None,
        *,
        restore_optimizer: bool = True,
    ) -> Submitted:
        body: dict[str, Any] = {"checkpoint_id": checkpoint_id, "restore_optimizer": restore_optimizer}
        if source_job_id is not None:
            body["source_job_id"] = source_job_id
        if target_sub_job_id is not None:
            body["target_sub_job_id"] = target_sub_job_id
        return self.call("load", {"job_id": job_id}, json=body)

    def weight_sync(
        self,
        job_id: str,
        source_sub_job_id: str | None = None,
        target_sub_job_ids: Sequence[str] | None = None,
        weight_format: str = "lora",
    ) -> Submitted:
        body: dict[str, Any] = {"format": weight_format}
        if source_sub_job_id is not None:
            body["source"] = source_sub_job_id
        if target_sub_job_ids is not None:
            body["targets"] = list(target_sub_job_ids)
        return self.call("weight_sync", {"job_id": job_id}, json=body)

    def list_checkpoints(self, job_id: str, **filters: Any) -> CheckpointList:
        """A job's checkpoints; `filters` are `ListCheckpointsQuery`'s (type, kept, min_step, max_step,
        created_before, created_after)."""
        params = {
            key: (str(value).lower() if isinstance(value, bool) else value)
            for key, value in filters.items()
            if value is not None
        }
        return self.call("list_checkpoints", {"job_id": job_id}, params=params or None)

    def keep_checkpoint(self, job_id: str, checkpoint_id: str, kept: bool = True) -> CheckpointRow:
        """Mark a checkpoint keep (no bulk delete removes it), or take the mark off."""
        return self.call(
            "update_checkpoint", {"job_id": job_id, "checkpoint_id": checkpoint_id}, json={"kept": kept}
        )

    def prune_checkpoints(
        self,
        job_id: str,
        *,
        keep_final: bool = True,
        older_than_s: float | None = None,
        dry_run: bool = False,
    ) -> PrunedCheckpoints:
        """Delete a job's checkpoints in bulk: all but `final` and the kept ones (or only those older than)."""
        body: dict[str, Any] = {"keep_final": keep_final, "dry_run": dry_run}
        if older_than_s is not None:
            body["older_than_s"] = float(older_than_s)
        return self.call("prune_checkpoints", {"job_id": job_id}, json=body)

    def storage(self, owner: str | None = None) -> StorageView:
        """Checkpoint bytes per owner (against the quota) and per job."""
        return self.call("storage", params={"owner": owner} if owner else None)

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> CheckpointRow:
        return self.call("get_checkpoint", {"job_id": job_id, "checkpoint_id": checkpoint_id})

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> DeletedCheckpoint:
        return self.call("delete_checkpoint", {"job_id": job_id, "checkpoint_id": checkpoint_id})

    def update_checkpoint(self, job_id: str, checkpoint_id: str, changes: dict[str, Any]) -> CheckpointRow:
        """`changes`: `ttl_seconds` (None: never expire) and/or `public`; a key left out stays as it is."""
        path = {"job_id": job_id, "checkpoint_id": checkpoint_id}
        return self.call("update_checkpoint", path, json=changes)

    def copy_checkpoint(
        self, job_id: str, checkpoint_id: str, ttl_seconds: int | None = None
    ) -> CheckpointRow:
        path = {"job_id": job_id, "checkpoint_id": checkpoint_id}
        return self.call("copy_checkpoint", path, json={"ttl_seconds": ttl_seconds})

    def export_checkpoint(
        self, job_id: str, checkpoint_id: str, sink: IO[bytes], *, contents: str = "adapter"
    ) -> str | None:
        """Stream a checkpoint's tar into `sink`; returns the SHA-256 of its manifest, as the backend sent it."""
        spec = route("export_checkpoint")
        headers = self.transport.download(
            spec.url(job_id=job_id, checkpoint_id=checkpoint_id), sink, params={"contents": contents}
        )
        return headers.get(MANIFEST_SHA_HEADER)

    # managed training datasets -------------------------------------------------------------------
    def put_dataset(self, dataset_id: str, data: bytes) -> DatasetRow:
        headers = {"Content-Type": "application/x-ndjson"}
        return self.call("put_dataset", {"dataset_id": dataset_id}, content=data, headers=headers)

    def get_dataset(self, dataset_id: str) -> DatasetRow:
        return self.call("get_dataset", {"dataset_id": dataset_id})

    # logs ----------------------------------------------------------------------------------------
    @recorded("tail_logs")
    def job_logs(
        self,
        job_id: str,
        cursor: int = 0,
        limit: int = 1000,
        sub_job: str | None = None,
        wait_s: float = 0.0,
    ) -> JobLogPage:
        return self.call(
            "job_logs",
            {"job_id": job_id},
            params={"cursor": cursor, "limit": limit, "sub_job": sub_job, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    @contextlib.contextmanager
    def follow_job_logs(
        self, job_id: str, cursor: int, *, sub_job: str | None = None, heartbeat_s: float = 10.0
    ) -> Iterator[Iterator[str]]:
        """The followed form of `job_logs`: its NDJSON records as text lines, until the job ends or the
        connection drops. A read timeout of a few heartbeats notices a silent, dead connection."""
        spec = route("job_logs")
        params = {"cursor": cursor, "follow": 1, "sub_job": sub_job, "heartbeat": heartbeat_s}
        with self.transport.stream(
            spec.method, spec.url(job_id=job_id), params=params, timeout_s=heartbeat_s * 3 + 5
        ) as response:
            yield response.iter_lines()

    # metrics and events --------------------------------------------------------------------------
    @recorded("get_job_metrics")
    def job_metrics(self, job_id: str, since: float | None = None, limit: int = 1000) -> JobMetrics:
        return self.call("job_metrics", {"job_id": job_id}, params={"since": since, "limit": limit})

    def host_metrics(self, since: float | None = None) -> HostMetrics:
        return self.call("host_metrics", params={"since": since})

    @recorded("list_events")
    def list_events(self, after: int = 0, limit: int = 100, wait_s: float = 0.0) -> EventPage:
        return self.call(
            "list_events",
            params={"after": after, "limit": limit, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def speedtest_download(self, size: int) -> int:
        """Ask for `size` bytes; returns how many arrived."""
        return len(self._raw("speedtest_download", {}, params={"bytes": size}).content)

    def speedtest_upload(self, data: bytes) -> SpeedtestReceived:
        headers = {"Content-Type": "application/octet-stream"}
        return self.call("speedtest_upload", content=data, headers=headers)

    def stats(
        self, since: float | None = None, until: float | None = None, owner: str | None = None
    ) -> Stats:
        return self.call("stats", params={"since": since, "until": until, "owner": owner})

    def client_telemetry(self, records: Sequence[Mapping[str, Any]]) -> TelemetryAccepted:
        return self.call("client_telemetry", json={"records": list(records)})

    def recent_telemetry(self, limit: int = 100) -> TelemetryRecords:
        return self.call("recent_telemetry", params={"limit": limit})

    # source runs ---------------------------------------------------------------------------------
    def create_run(self, body: Mapping[str, Any], *, idempotency_key: str, timeout_s: float) -> RunRow:
        """Submit a run (`runs.py` builds the body); the backend re-hashes the archive before answering."""
        return self.call("create_run", json=dict(body), idempotency_key=idempotency_key, timeout_s=timeout_s)

    def upload_run_chunk(self, upload_id: str, index: int, data: bytes, count: int) -> ChunkStored:
        headers = {wire.CHUNK_SHA_HEADER: wire.sha256_hex(data), wire.CHUNK_COUNT_HEADER: str(count)}
        return self.call(
            "upload_run_chunk",
            {"upload_id": upload_id, "index": str(index)},
            content=data,
            headers=headers,
            idempotency_key=f"{upload_id}-{index}",
        )

    def list_runs(
        self,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        submission_id: str | None = None,
        **filters: Any,
    ) -> RunPage:
        """`filters`: any of `LISTING_FILTERS` (name, since, until, label, owner)."""
        params = {
            "status": status,
            "limit": limit,
            "cursor": cursor,
            "submission_id": submission_id,
            **_filters(filters),
        }
        return self.call("list_runs", params=params)

    def get_run(self, run_id: str, wait_s: float = 0.0, while_status: str | None = None) -> RunRow:
        return self.call(
            "get_run",
            {"run_id": run_id},
            params={"wait": wait_s or None, "while_status": while_status if wait_s else None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def cancel_run(self, run_id: str) -> RunRow:
        return self.call("cancel_run", {"run_id": run_id})

    def run_logs(self, run_id: str, cursor: int = 0, limit: int = 1000, wait_s: float = 0.0) -> RunLogPage:
        return self.call(
            "run_logs",
            {"run_id": run_id},
            params={"cursor": cursor, "limit": limit, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def run_report(self, run_id: str) -> RunReport:
        return self.call("run_report", {"run_id": run_id})

    def list_run_outputs(self, run_id: str) -> RunOutputs:
        return self.call("list_run_outputs", {"run_id": run_id})

    def get_run_output(self, run_id: str, name: str) -> bytes:
        """One output's bytes as collected (the caller checks them against `list_run_outputs`)."""
        return self._raw("get_run_output", {"run_id": run_id, "name": name}).content


# --- one-off calls outside a Client -------------------------------------------------------------------


def probe_version(
    url: str, *, verify: Any = True, timeout_s: float = 2.0, challenge: str | None = None
) -> VersionInfo:
    """`GET /version` of a backend, once, without retries and without a token (is the local backend
    there? with `challenge`: can it prove it is the one its state file names?)."""
    transport = Transport(url, None, timeout_s=timeout_s, retry=RetryPolicy(max_attempts=1), verify=verify)
    try:
        return Api(transport, strict=False).version(challenge)
    finally:
        transport.close()


def probe_status(
    url: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    cookies: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int, Any]:
    """(HTTP status, JSON body or text) of `GET url + path`, once and whatever the status: a Jupyter
    server's proxy status, which answers in its own words (its caller reads 404 as "no proxy")."""
    transport = Transport(
        url,
        None,
        timeout_s=timeout_s,
        retry=RetryPolicy(max_attempts=1),
        extra_headers=dict(headers or {}),
        cookies=dict(cookies or {}),
    )
    try:
        return transport.status_of("GET", path)
    finally:
        transport.close()


class TelemetryChannel:
    """`POST /v1/telemetry` on a connection of its own (short timeout, no retries), for the sender thread
    of `telemetry.Telemetry`: a lost report is acceptable, a stalled operation is not."""

    def __init__(
        self, url: str, headers: Mapping[str, str], cookies: Mapping[str, str] | None, verify: Any
    ) -> None:
        self._transport = Transport(
            url,
            None,
            timeout_s=2.0,
            retry=RetryPolicy(max_attempts=1),
            extra_headers=dict(headers),
            cookies=dict(cookies or {}),
            verify=verify,
        )
        self._api = Api(self._transport, strict=False)

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        self._api.client_telemetry(records)

    def close(self) -> None:
        self._transport.close()


def _routing(router_replay: Sequence[str] | None, record_routes: bool) -> dict[str, Any]:
    """Frame metadata of router replay (docs/router-replay.md): the `routes_id` each row replays, and
    whether to return the experts the forward used."""
    metadata: dict[str, Any] = {}
    if router_replay is not None:
        metadata["router_replay"] = list(router_replay)
    if record_routes:
        metadata["record_routes"] = True
    return metadata
