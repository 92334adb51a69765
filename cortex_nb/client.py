"""`cortex_nb.Client`: the low-level SDK. Method names follow the public Cortex Training SDK.

Data-plane calls (`forward_backward`, `step`, `generate`, `forward`) return a request id at once;
`poll_request` waits for its result. `TrainingJob` and `Sampler` (training.py) wrap these in futures.
"""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import errors, profiles, tls
from .log_stream import LogStream
from .protocol import wire
from .protocol.checkpoint_format import MANIFEST_SHA_HEADER
from .protocol.losses import LOSSES, wire_dtype
from .protocol.routes import route
from .protocol.states import JOB_RUNNING, JOB_TERMINAL, REQUEST_SUCCEEDED, REQUEST_TERMINAL
from .protocol.versions import API_VERSION, api_major
from .telemetry import Telemetry, recorded
from .transport import RetryPolicy, Transport


@dataclass
class PollPolicy:
    """How long-running things are awaited. With `long_poll` the backend holds each poll open until
    something changes (up to `long_poll_s`); the interval knobs pace plain polling."""

    interval_s: float = 0.5
    multiplier: float = 1.25
    max_interval_s: float = 6.0
    timeout_s: float = 1800.0
    long_poll: bool = True
    long_poll_s: float = 25.0

    def intervals(self) -> Iterator[float]:
        interval = self.interval_s
        while True:
            yield interval
            interval = min(interval * self.multiplier, self.max_interval_s)


def as_batch(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Lists or arrays -> numpy with the dtypes the losses' tensor specs name (ids int64, the rest float32)."""
    return {name: np.asarray(value).astype(wire_dtype(name)) for name, value in batch.items()}


class Client:
    """A connection to one backend. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        poll: PollPolicy | None = None,
        check_version: bool = True,
        auth_scheme: str = "Bearer",
        extra_headers: dict[str, str] | None = None,
        cookies: dict[str, str] | None = None,
        verify: bool | str | None = None,
    ) -> None:
        """`verify` checks an https backend's certificate: True (system CAs, the default; else
        $CORTEX_VERIFY), a CA file, or a `sha256:...` pin (see cortex_nb/tls.py)."""
        self.url = url.rstrip("/")
        self.poll = poll or PollPolicy()
        self.transport = Transport(
            self.url,
            token,
            auth_scheme=auth_scheme,
            timeout_s=timeout_s,
            retry=retry,
            extra_headers=extra_headers,
            cookies=cookies,
            verify=verify if verify is not None else tls.verify_from_env(),
        )
        # Frames above `max_body_bytes` travel as chunks of `chunk_bytes` (each with its SHA-256).
        self.max_body_bytes = wire.MAX_BODY_BYTES
        self.chunk_bytes = wire.CHUNK_BYTES
        self.backend_version: dict[str, Any] | None = None
        self.local_backend = None  # the LocalEndpoint of Client.local()
        self.telemetry = Telemetry(
            self.url, self.transport.headers, self.transport.cookies, verify=self.transport.verify
        )
        if check_version:
            self.check_version()

    # construction --------------------------------------------------------------------------------
    @classmethod
    def from_profile(cls, name: str | None = None, **kwargs: Any) -> Client:
        """Env `CORTEX_URL`/`CORTEX_TOKEN` (when no name is given), else the named or default profile."""
        endpoint = (profiles.from_env() if name is None else None) or profiles.from_profile(name)
        if endpoint is None:
            raise errors.CortexError(
                f"no backend configured: set CORTEX_URL and CORTEX_TOKEN, add a profile to {profiles.config_path()},"
                " or use Client.local() for your local backend",
                code="invalid_request",
            )
        kwargs.setdefault("verify", endpoint.verify)
        return cls(endpoint.url, endpoint.token, **kwargs)

    @classmethod
    def local(cls, data_dir: str | Path | None = None, **kwargs: Any) -> Client:
        """This user's local backend (`cortex_nb.local`): found through its state file, or started as a
        process of its own that outlives this one and stops after half an hour with nothing to do."""
        from .local import ensure_local_backend

        options = ("models", "devices", "warm_workers", "idle_exit_s")
        backend = ensure_local_backend(data_dir, **{k: kwargs.pop(k) for k in list(kwargs) if k in options})
        if backend.tls_fingerprint:
            kwargs.setdefault("verify", backend.tls_fingerprint)
        client = cls(backend.url, backend.token, **kwargs)
        client.local_backend = backend
        return client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.telemetry.close()
        self.transport.close()

    def __repr__(self) -> str:
        version = (self.backend_version or {}).get("version", "?")
        return f"<cortex_nb.Client {self.url} backend {version}>"

    def _call(self, name: str, *, path_params: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
        spec = route(name)
        return self.transport.json(spec.method, spec.url(**(path_params or {})), **kwargs)

    # meta ----------------------------------------------------------------------------------------
    @recorded("check_version")
    def check_version(self) -> dict[str, Any]:
        info = self._call("version")
        if api_major(str(info.get("api_version", "0"))) != api_major(API_VERSION):
            raise errors.VersionMismatchError(
                f"the backend at {self.url} speaks API {info.get('api_version')} but this client speaks {API_VERSION};"
                " install matching versions of cortex-nb on both sides",
                code="version_mismatch",
            )
        self.backend_version = info
        return info

    def whoami(self) -> dict[str, Any]:
        return self._call("whoami")

    def get_capacity(self) -> dict[str, Any]:
        return self._call("capacity")

    def list_models(self) -> list[dict[str, Any]]:
        return self._call("list_models")["models"]

    def tokenize(self, model: str, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        body = {"texts": list(texts), "add_special_tokens": add_special_tokens}
        return self._call("tokenize", path_params={"model": model}, json=body)["tokens"]

    def tokenizer_info(self, model: str) -> dict[str, Any]:
        return self._call("tokenize", path_params={"model": model}, json={"texts": []})

    def detokenize(self, model: str, tokens: list[list[int]]) -> list[str]:
        return self._call("detokenize", path_params={"model": model}, json={"tokens": tokens})["texts"]

    # jobs ----------------------------------------------------------------------------------------
    @recorded("create_job")
    def create_job(
        self,
        sub_jobs: list[dict[str, Any]],
        job_id: str | None = None,
        experiment_name: str | None = None,
        hardware: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        idle_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        body = {
            "sub_jobs": sub_jobs,
            "job_id": job_id,
            "experiment": experiment_name,
            "hardware": hardware,
            "name": name,
            "idle_timeout_s": idle_timeout_s,
        }
        return self._call("create_job", json={key: value for key, value in body.items() if value is not None})

    @recorded("get_job")
    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._call("get_job", path_params={"job_id": job_id})

    @recorded("list_jobs")
    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = []
        cursor = None
        while len(jobs) < limit:
            page = self._call(
                "list_jobs", params={"status": status, "limit": min(limit - len(jobs), 500), "cursor": cursor}
            )
            jobs.extend(page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return jobs

    @recorded("wait_for_progress")
    def wait_for_progress(self, job_id: str, after: float | None, wait_s: float) -> dict[str, Any]:
        """The job once its progress record is newer than `after` (its `updated_at`), its status
        changes or its place in the queue moves, or after `wait_s`: one request per update."""
        return self._call(
            "get_job",
            path_params={"job_id": job_id},
            params={"wait": wait_s, "after_progress": after if after is not None else 0.0},
            timeout_s=wait_s + 30,
        )

    @recorded("wait_for_job")
    def wait_for_job(
        self,
        job_id: str,
        until: tuple[str, ...] = (JOB_RUNNING, *JOB_TERMINAL),
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Wait until the job reaches one of `until` (default: running or finished)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.poll.timeout_s)
        intervals = self.poll.intervals()
        job = self.get_job(job_id)
        while job["status"] not in until:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.TimeoutError(
                    f"job {job_id} is still {job['status']} after waiting; it keeps going", code="timeout"
                )
            if self.poll.long_poll:
                job = self._call(
                    "get_job",
                    path_params={"job_id": job_id},
                    params={"wait": min(self.poll.long_poll_s, remaining), "while_status": job["status"]},
                    timeout_s=self.poll.long_poll_s + 30,
                )
            else:
                time.sleep(min(next(intervals), remaining))
                job = self.get_job(job_id)
        return job

    @recorded("cancel_job")
    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._call("cancel_job", path_params={"job_id": job_id})

    @recorded("complete_job")
    def complete_job(self, job_id: str) -> dict[str, Any]:
        """Free a job's device ("Free device"): it ends `done` once its queued requests finish. Trained
        steps no checkpoint holds are saved first, as checkpoint `final` (named in `saved_checkpoint`)."""
        return self._call("complete_job", path_params={"job_id": job_id})

    # managed training ----------------------------------------------------------------------------
    def upload_dataset(self, data: bytes) -> str:
        """Upload JSONL training rows once; returns the dataset id (their SHA-256). Nothing is sent
        when the backend already has them."""
        dataset_id = wire.sha256_hex(data)
        try:
            self._call("get_dataset", path_params={"dataset_id": dataset_id})
        except errors.NotFoundError:
            self.transport.json(
                "PUT",
                route("put_dataset").url(dataset_id=dataset_id),
                content=data,
                headers={"Content-Type": "application/x-ndjson"},
            )
        return dataset_id

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self._call("get_dataset", path_params={"dataset_id": dataset_id})

    def train(
        self,
        spec: Any,
        *,
        name: str | None = None,
        namespace: Mapping[str, Any] | None = None,
        experiment: str | None = None,
        idle_timeout_s: float | None = None,
    ):
        """Start a managed training run and return its `TrainingJob` at once: the backend runs the loop
        (batching, eval, samples, checkpoints) in the training worker, so it outlives this process.

        `spec` is a `TrainSpec`, a dict of the `%%cortex train` YAML keys, or that YAML text. Its data
        (and eval data) is a JSONL or .txt path, `$name` of a variable in `namespace`, or (in a dict) the
        rows themselves: they are uploaded once as a dataset. Watch it with `job.progress`,
        `job.history` and `job.wait()`.
        """
        from .train_data import examples_to_jsonl, load_examples
        from .train_spec import TrainSpec, spec_from
        from .training import TrainingJob

        spec, data_rows, eval_rows = spec_from(spec)
        if not isinstance(spec, TrainSpec):
            raise TypeError("spec must be a TrainSpec, a dict of train-spec keys or YAML text")
        namespace = dict(namespace or {})
        if data_rows is not None:
            namespace["__cortex_data__"], spec.data = data_rows, "$__cortex_data__"
        if eval_rows is not None and spec.eval is not None:
            namespace["__cortex_eval__"], spec.eval.data = eval_rows, "$__cortex_eval__"
        dataset_id = self.upload_dataset(examples_to_jsonl(load_examples(spec.data, namespace, "data")))
        eval_id = None
        if spec.eval is not None:
            eval_id = self.upload_dataset(
                examples_to_jsonl(load_examples(spec.eval.data, namespace, "eval.data"))
            )
        body = {
            "sub_jobs": [spec.sub_job()],
            "training_loop": spec.training_loop(dataset_id, eval_id),
            "name": name,
            "experiment": experiment,
            "idle_timeout_s": idle_timeout_s,
        }
        job = self._call("create_job", json={key: value for key, value in body.items() if value is not None})
        return TrainingJob(self, job)

    # data plane ----------------------------------------------------------------------------------
    def _submit_frame(self, name: str, job_id: str, frame: bytes, sub_job: str | None) -> str:
        spec = route(name)
        path = spec.url(job_id=job_id)
        params = {"sub_job": sub_job}
        if len(frame) <= self.max_body_bytes:
            response = self.transport.json(
                spec.method,
                path,
                content=frame,
                params=params,
                headers={"Content-Type": wire.FRAME_CONTENT_TYPE},
            )
            return response["request_id"]
        upload_id = "up-" + uuid.uuid4().hex
        chunks = wire.split_chunks(frame, self.chunk_bytes)
        for chunk in chunks:
            self.transport.request(
                "PUT",
                route("upload_chunk").url(upload_id=upload_id, index=str(chunk.index)),
                content=chunk.data,
                headers={wire.CHUNK_SHA_HEADER: chunk.sha256, wire.CHUNK_COUNT_HEADER: str(len(chunks))},
                idempotency_key=f"{upload_id}-{chunk.index}",
            )
        response = self.transport.json(
            spec.method,
            path,
            params=params,
            idempotency_key=upload_id,
            headers={wire.UPLOAD_HEADER: upload_id, wire.UPLOAD_SHA_HEADER: wire.sha256_hex(frame)},
        )
        return response["request_id"]

    @recorded("forward_backward")
    def forward_backward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
        *,
        sub_job: str | None = None,
    ) -> str:
        """Queue a forward+backward pass; gradients accumulate until `step`. Returns the request id."""
        if loss_fn not in LOSSES:
            raise errors.BadRequestError(
                f"loss_fn must be one of {sorted(LOSSES)}, got {loss_fn!r}", code="unknown_loss"
            )
        frame = wire.encode_frame(
            as_batch(batch), {"loss_fn": loss_fn, "loss_fn_config": loss_fn_config or {}}
        )
        return self._submit_frame("forward_backward", job_id, frame, sub_job)

    @recorded("forward")
    def forward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        *,
        adapter: str | dict[str, str] | None = None,
        loss_fn: str | None = None,
        loss_fn_config: dict[str, float] | None = None,
        sub_job: str | None = None,
    ) -> str:
        """Queue a scoring pass: log p(target_tokens) per position, no gradients. `adapter` scores with
        "base" (no adapter) or a saved checkpoint's ({"checkpoint_id", "job_id"?}) instead of the live one;
        `loss_fn` also reports that loss and its metrics (nothing is accumulated)."""
        metadata: dict[str, Any] = {}
        if adapter is not None:
            metadata["adapter"] = adapter
        if loss_fn is not None:
            metadata.update(loss_fn=loss_fn, loss_fn_config=loss_fn_config or {})
        return self._submit_frame("forward", job_id, wire.encode_frame(as_batch(batch), metadata), sub_job)

    @recorded("step")
    def step(
        self,
        job_id: str,
        learning_rate: float | None = None,
        *,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        grad_clip: float | None = None,
        sub_job: str | None = None,
    ) -> str:
        """Queue an optimizer step. Hyperparameters given apply to this step only; the others are the job's."""
        given = {
            "learning_rate": learning_rate,
            "betas": list(betas) if betas is not None else None,
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_clip": grad_clip,
        }
        body = {key: value for key, value in given.items() if value is not None}
        return self._call("step", path_params={"job_id": job_id}, json=body, params={"sub_job": sub_job})[
            "request_id"
        ]

    @recorded("generate")
    def generate(
        self,
        job_id: str,
        prompts: list[str] | list[list[int]],
        sampling_params: dict[str, Any] | None = None,
        *,
        adapter: str | dict[str, str] | None = None,
        sub_job: str | None = None,
    ) -> str:
        """Queue sampling. `adapter` samples with "base" (none) or a saved checkpoint's ({"checkpoint_id",
        "job_id"?}) instead of the sub-job's live adapter: a snapshot that later training does not change."""
        body: dict[str, Any] = {"prompts": list(prompts), "sampling_params": sampling_params or {}}
        if adapter is not None:
            body["adapter"] = adapter
        return self._call("generate", path_params={"job_id": job_id}, json=body, params={"sub_job": sub_job})[
            "request_id"
        ]

    def noop(self, job_id: str, *, sub_job: str | None = None) -> str:
        """A request that does nothing in the worker: measures the round trip."""
        return self._call("noop", path_params={"job_id": job_id}, json={}, params={"sub_job": sub_job})[
            "request_id"
        ]

    # requests ------------------------------------------------------------------------------------
    def get_request_status(
        self, job_id: str, request_id: str, cursor: int = 0, wait_s: float = 0.0
    ) -> dict[str, Any]:
        return self._call(
            "get_request",
            path_params={"job_id": job_id, "request_id": request_id},
            params={"cursor": cursor, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    @recorded("poll_request")
    def poll_request(self, job_id: str, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for a request to finish and return its result (with `tensors` decoded, if any).

        Raises `RequestFailed` (with the failure code) if it failed or was cancelled, and
        `TimeoutError` if waiting locally runs out; the request itself keeps running.
        """
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.poll.timeout_s)
        intervals = self.poll.intervals()
        cursor = 0
        while True:
            remaining = deadline - time.monotonic()
            wait_s = min(self.poll.long_poll_s, max(remaining, 0)) if self.poll.long_poll else 0.0
            status = self.get_request_status(job_id, request_id, cursor, wait_s)
            cursor = status["cursor"]
            if status["status"] in REQUEST_TERMINAL:
                return self._finished_result(job_id, status)
            if time.monotonic() >= deadline:
                raise errors.TimeoutError(
                    f"request {request_id} is still {status['status']}; it keeps running. Poll again or cancel it.",
                    code="timeout",
                )
            if not self.poll.long_poll:
                time.sleep(min(next(intervals), max(deadline - time.monotonic(), 0)))

    def _finished_result(self, job_id: str, status: dict[str, Any]) -> dict[str, Any]:
        if status["status"] != REQUEST_SUCCEEDED:
            error = status.get("error") or {}
            raise errors.RequestFailed(
                f"{status['op']} request {status['request_id']} {status['status']}: {error.get('message', '')}".strip(),
                code=error.get("code", status["status"]),
                detail={"request": status},
            )
        result = dict(status.get("result") or {})
        if status.get("has_tensors"):
            response = self.transport.request(
                "GET", route("get_request_tensors").url(job_id=job_id, request_id=status["request_id"])
            )
            data = response.content
            expected = response.headers.get("X-Cortex-Sha256")
            if expected and wire.sha256_hex(data) != expected:
                raise errors.BackendError(
                    "the result tensors arrived corrupted (SHA-256 mismatch); retry the poll",
                    code="chunk_mismatch",
                )
            result["tensors"], _ = wire.decode_frame(data)
        return result

    @recorded("cancel_request")
    def cancel_request(self, job_id: str, request_id: str) -> dict[str, Any]:
        return self._call("cancel_request", path_params={"job_id": job_id, "request_id": request_id})

    def list_requests(self, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("list_requests", path_params={"job_id": job_id}, params={"limit": limit})[
            "requests"
        ]

    # checkpoints and weight sync -----------------------------------------------------------------
    def save(
        self,
        job_id: str,
        checkpoint_id: str | None = None,
        checkpoint_type: str = "resumable",
        *,
        sub_job: str | None = None,
    ) -> str:
        """Queue a save of the trainer's adapter ("weights-only") or adapter + optimizer + step + RNG
        ("resumable"). The result names the checkpoint (`step-N` unless `checkpoint_id` is given)."""
        body: dict[str, Any] = {"type": checkpoint_type}
        if checkpoint_id is not None:
            body["checkpoint_id"] = checkpoint_id
        return self._call("save", path_params={"job_id": job_id}, json=body, params={"sub_job": sub_job})[
            "request_id"
        ]

    def load(
        self,
        job_id: str,
        checkpoint_id: str,
        source_job_id: str | None = None,
        target_sub_job_id: str | None = None,
        *,
        restore_optimizer: bool = True,
    ) -> str:
        """Queue a load of a checkpoint (of this job, or of `source_job_id`, another job of yours) into the
        trainer or `target_sub_job_id`. A resumable checkpoint loaded into a trainer also restores its
        optimizer state, step counter and RNG state unless `restore_optimizer` is False."""
        body: dict[str, Any] = {"checkpoint_id": checkpoint_id, "restore_optimizer": restore_optimizer}
        if source_job_id is not None:
            body["source_job_id"] = source_job_id
        if target_sub_job_id is not None:
            body["target_sub_job_id"] = target_sub_job_id
        return self._call("load", path_params={"job_id": job_id}, json=body)["request_id"]

    def weight_sync(
        self,
        job_id: str,
        source_sub_job_id: str | None = None,
        target_sub_job_ids: list[str] | None = None,
        weight_format: str = "lora",
    ) -> str:
        """Queue a sync of the trainer's current weights into sampling sub-jobs (all of them by default).
        "lora" sends fp16 deltas where the sampler's weights are known (else the full tensors);
        "full" always sends the exact float32 tensors. The result reports path, bytes and ms."""
        body: dict[str, Any] = {"format": weight_format}
        if source_sub_job_id is not None:
            body["source"] = source_sub_job_id
        if target_sub_job_ids is not None:
            body["targets"] = list(target_sub_job_ids)
        return self._call("weight_sync", path_params={"job_id": job_id}, json=body)["request_id"]

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """The job's valid checkpoints, oldest first (a finished job's too)."""
        return self._call("list_checkpoints", path_params={"job_id": job_id})["checkpoints"]

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        return self._call("get_checkpoint", path_params={"job_id": job_id, "checkpoint_id": checkpoint_id})

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        """Delete a checkpoint; refused (ConflictError, `checkpoint_in_use`) while a load or export reads it."""
        return self._call("delete_checkpoint", path_params={"job_id": job_id, "checkpoint_id": checkpoint_id})

    def export_checkpoint(
        self, job_id: str, checkpoint_id: str, dest: str | Path, *, contents: str = "adapter"
    ) -> Path:
        """Download a checkpoint into `dest` (a new or empty directory): a PEFT adapter directory
        (`adapter_config.json` + `adapter_model.safetensors` + `manifest.json`), or with
        `contents="all"` every file of the checkpoint. Every file's SHA-256 is checked on arrival;
        nothing is left in `dest` if one does not match."""
        import tempfile

        from .checkpoint_files import extract_verified

        path = route("export_checkpoint").url(job_id=job_id, checkpoint_id=checkpoint_id)
        with tempfile.TemporaryFile() as archive:
            headers = self.transport.download(path, archive, params={"contents": contents})
            extract_verified(archive, Path(dest), headers.get(MANIFEST_SHA_HEADER))
        return Path(dest)

    # logs ----------------------------------------------------------------------------------------
    @recorded("tail_logs")
    def tail_logs(
        self,
        job_id: str,
        cursor: int | None = None,
        limit: int = 1000,
        sub_job: str | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """One page of log lines after `cursor`: {lines, cursor, dropped, job_status}. With `wait_s`,
        the backend holds the call until the first new line arrives (or that many seconds pass)."""
        return self._call(
            "job_logs",
            path_params={"job_id": job_id},
            params={"cursor": cursor or 0, "limit": limit, "sub_job": sub_job, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def stream_logs(
        self,
        job_id: str,
        follow: bool = True,
        *,
        cursor: int | None = None,
        sub_job: str | None = None,
        heartbeat_s: float = 10.0,
    ) -> LogStream:
        """Iterate over log lines after `cursor`. With `follow`, keep going until the job ends,
        resuming from the last line received if the connection drops; without, stop at the end."""
        return LogStream(
            self, job_id, follow=follow, cursor=cursor or 0, sub_job=sub_job, heartbeat_s=heartbeat_s
        )

    @recorded("download_stdout_logs")
    def download_stdout_logs(self, job_id: str, out_dir: str | Path) -> dict[str, Path]:
        """Write every retained line to `<out_dir>/<sub_job_id>/stdout.log` (and `stderr.log` when the
        sub-job wrote to stderr). Returns the stdout.log path of each sub-job."""
        out = Path(out_dir)
        job = self.get_job(job_id)
        paths = {sub["sub_job_id"]: out / sub["sub_job_id"] / "stdout.log" for sub in job["sub_jobs"]}
        handles: dict[tuple[str, str], Any] = {}
        stream = LogStream(self, job_id, follow=False)
        try:
            for path in paths.values():
                path.parent.mkdir(parents=True, exist_ok=True)
                handles[(path.parent.name, "stdout")] = path.open("w", encoding="utf-8")
            for line in stream:
                key = (line["sub_job_id"], "stderr" if line["stream"] == "stderr" else "stdout")
                if key not in handles:
                    folder = out / key[0]
                    folder.mkdir(parents=True, exist_ok=True)
                    handles[key] = (folder / f"{key[1]}.log").open("w", encoding="utf-8")
                    paths.setdefault(key[0], folder / "stdout.log")
                handles[key].write(line["line"] + "\n")
        finally:
            for handle in handles.values():
                handle.close()
        if stream.dropped:
            warnings.warn(
                f"job {job_id}: {stream.dropped} older log line(s) were dropped by the backend's retention"
                " before they could be downloaded",
                stacklevel=2,
            )
        return paths

    # metrics and events ----------------------------------------------------------------------------
    @recorded("get_job_metrics")
    def get_job_metrics(self, job_id: str, since: float | None = None, limit: int = 1000) -> dict[str, Any]:
        """One page of device samples of a job: {samples, next_since, gpu_unavailable_reason, ...}."""
        return self._call(
            "job_metrics", path_params={"job_id": job_id}, params={"since": since, "limit": limit}
        )

    def job_metric_samples(self, job_id: str, since: float | None = None) -> list[dict[str, Any]]:
        """Every device sample of a job after `since` (all pages)."""
        samples: list[dict[str, Any]] = []
        since = since or 0.0
        while True:
            page = self.get_job_metrics(job_id, since, limit=10_000)
            samples.extend(page["samples"])
            if not page["samples"]:
                return samples
            since = page["next_since"]

    @recorded("download_metrics")
    def download_metrics(self, job_id: str, out_dir: str | Path) -> Path:
        """Write a job's device samples to `<out_dir>/gpu.jsonl`, one JSON object per line."""
        path = Path(out_dir) / "gpu.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        samples = self.job_metric_samples(job_id)
        with path.open("w", encoding="utf-8") as handle:
            for sample in samples:
                handle.write(json.dumps(sample) + "\n")
        return path

    def metrics_df(self, job_id: str):
        """A job's device samples as a pandas DataFrame (GPU columns only where GPUs were sampled)."""
        from .views import metrics_frame

        return metrics_frame(self.job_metric_samples(job_id))

    def host_metrics(self, since: float | None = None) -> dict[str, Any]:
        """The backend host's newest sample per device: {samples, devices, gpu_unavailable_reason, ...}."""
        return self._call("host_metrics", params={"since": since})

    @recorded("list_events")
    def list_events(self, after: int = 0, limit: int = 100, wait_s: float = 0.0) -> dict[str, Any]:
        """Job and request state changes after `after`: {events, cursor}. With `wait_s`, wait up to
        that long for the first one. Reading removes nothing: ask again from the same cursor at will."""
        return self._call(
            "list_events",
            params={"after": after, "limit": limit, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    # source runs ---------------------------------------------------------------------------------
    def run(
        self,
        spec: str | Path | Mapping[str, Any],
        *,
        submission_id: str | None = None,
        base_dir: str | Path | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ):
        """Run your own code on the backend host: a `cortex.yaml` path (or a spec mapping) -> `RunHandle`.

        The included files and inputs are captured with a SHA-256 manifest and uploaded; this returns once
        the backend has verified them and queued the run. If the answer is lost, `SubmissionOutcomeUnknown`
        names the submission id to `resume`; the same submission id never runs twice.
        """
        from .runs import RunHandle, build_submission, load_spec, submit

        checked, folder = load_spec(spec, base_dir)
        submission = build_submission(checked, folder, files)
        try:
            return RunHandle(self, submit(self, submission, submission_id))
        finally:
            submission.close()

    def resume(self, submission_id: str):
        """The run a submission id created (after `SubmissionOutcomeUnknown`); `NotFoundError` if none was."""
        from .runs import RunHandle

        runs = self.list_runs(submission_id=submission_id)
        if not runs:
            raise errors.NotFoundError(
                f"the backend has no run for submission {submission_id!r}: the submission never arrived."
                " Submit again with the same submission_id",
                code="run_not_found",
                status=404,
            )
        return RunHandle(self, runs[0])

    def run_handle(self, run_id: str):
        """Attach to an existing run."""
        from .runs import RunHandle

        return RunHandle(self, self.get_run(run_id))

    def history(self, limit: int = 20):
        """Recent runs, newest first, as a pandas DataFrame."""
        from .views import runs_frame

        return runs_frame(self.list_runs(limit=limit))

    def get_run(self, run_id: str, wait_s: float = 0.0, while_status: str | None = None) -> dict[str, Any]:
        return self._call(
            "get_run",
            path_params={"run_id": run_id},
            params={"wait": wait_s or None, "while_status": while_status if wait_s else None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def list_runs(
        self, status: str | None = None, limit: int = 50, submission_id: str | None = None
    ) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        cursor = None
        while len(runs) < limit:
            page = self._call(
                "list_runs",
                params={
                    "status": status,
                    "limit": min(limit - len(runs), 500),
                    "cursor": cursor,
                    "submission_id": submission_id,
                },
            )
            runs.extend(page["runs"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return runs

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return self._call("cancel_run", path_params={"run_id": run_id})

    def run_logs(
        self, run_id: str, cursor: int = 0, limit: int = 1000, wait_s: float = 0.0
    ) -> dict[str, Any]:
        return self._call(
            "run_logs",
            path_params={"run_id": run_id},
            params={"cursor": cursor, "limit": limit, "wait": wait_s or None},
            timeout_s=wait_s + 30 if wait_s else None,
        )

    def run_report(self, run_id: str) -> dict[str, Any]:
        return self._call("run_report", path_params={"run_id": run_id})

    def list_run_outputs(self, run_id: str) -> dict[str, Any]:
        return self._call("list_run_outputs", path_params={"run_id": run_id})

    def download_run_output(
        self, run_id: str, name: str, dest: str | Path, expected: dict[str, Any] | None = None
    ) -> Path:
        """Save one output at `dest` after checking its length and SHA-256 against the backend's record."""
        from .runs import verify_output_bytes

        if expected is None:
            rows = {row["name"]: row for row in self.list_run_outputs(run_id)["outputs"]}
            if name not in rows:
                raise errors.NotFoundError(
                    f"run {run_id} declares no output {name!r}", code="output_not_declared", status=404
                )
            expected = rows[name]
        response = self.transport.request("GET", route("get_run_output").url(run_id=run_id, name=name))
        verify_output_bytes(response.content, expected, f"output {name!r} of run {run_id}")
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        partial.write_bytes(response.content)
        partial.replace(dest)
        return dest

    # higher-level objects ------------------------------------------------------------------------
    def create_training_job(self, base_model: str = "tiny", **kwargs: Any):
        """A `TrainingJob` (training sub-job, plus `samplers` sampling sub-jobs)."""
        from .training import TrainingJob

        return TrainingJob.create(self, base_model, **kwargs)

    def create_sampler(self, base_model: str = "tiny", **kwargs: Any):
        from .training import Sampler

        return Sampler.create(self, base_model, **kwargs)

    def training_job(self, job_id: str):
        """Attach to an existing job."""
        from .training import TrainingJob

        return TrainingJob(self, self.get_job(job_id))
