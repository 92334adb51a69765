"""`cortex_nb.Client`: the SDK's façade. Method names follow the public Cortex Training SDK.

Layers, one direction only: the route table (`protocol/routes.py`) -> its HTTP binding (`api.py`, the only
place that builds requests) -> the objects users hold (`TrainingJob`, `Sampler`, `RunHandle`, futures, log
streams, views) -> this façade, which builds one `Api` and hands it to them. Data-plane calls
(`forward_backward`, `step`, `generate`, `forward`) return a request id at once; `poll_request` waits for
its result. `TrainingJob` and `Sampler` (training.py) wrap these in futures.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import errors, polling, profiles, tls
from .api import Api, TelemetryChannel
from .batching import as_batch
from .log_stream import LogStream
from .poll_policy import PollPolicy
from .protocol.states import JOB_RUNNING, JOB_TERMINAL, is_short_lived
from .protocol.versions import API_VERSION, api_major
from .runs import RunHandle, download_output, resume_run, start_run
from .telemetry import Telemetry, recorded
from .training import Sampler, TrainingJob, start_training, step_body
from .transport import RetryPolicy, Transport

if TYPE_CHECKING:
    import pandas as pd

    from .local import LocalEndpoint

# Names this module has always exported.
__all__ = ["Client", "PollPolicy", "RetryPolicy", "as_batch"]


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
        reconnect_s: float | None = None,
    ) -> None:
        """`verify` checks an https backend's certificate: True (system CAs, the default; else
        $CORTEX_VERIFY), a CA file, or a `sha256:...` pin (see cortex_nb/tls.py). `reconnect_s` is how
        long waits on a job ride through a backend that does not answer (default 180 s; see reconnect.py)."""
        self.url = url.rstrip("/")
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
        self.telemetry = Telemetry(
            self.url,
            self.transport.headers,
            self.transport.cookies,
            verify=self.transport.verify,
            connect=TelemetryChannel,
        )
        self.api = Api(self.transport, poll=poll, telemetry=self.telemetry)
        if reconnect_s is not None:
            self.api.poll.reconnect_s = float(reconnect_s)
        self.backend_version: dict[str, Any] | None = None
        self.local_backend: LocalEndpoint | None = None  # set by Client.local()
        if check_version:
            self.check_version()

    # settings the objects share through the api ------------------------------------------------------
    @property
    def poll(self) -> PollPolicy:
        return self.api.poll

    @poll.setter
    def poll(self, policy: PollPolicy) -> None:
        self.api.poll = policy

    @property
    def max_body_bytes(self) -> int:
        """Frames above this travel as chunks of `chunk_bytes` (each with its SHA-256)."""
        return self.api.max_body_bytes

    @max_body_bytes.setter
    def max_body_bytes(self, size: int) -> None:
        self.api.max_body_bytes = size

    @property
    def chunk_bytes(self) -> int:
        return self.api.chunk_bytes

    @chunk_bytes.setter
    def chunk_bytes(self, size: int) -> None:
        self.api.chunk_bytes = size

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
        if endpoint.reconnect_s is not None:
            kwargs.setdefault("reconnect_s", endpoint.reconnect_s)
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
        """Any route by name, its reply checked (`Api.call`): for what no method covers yet."""
        return self.api.call(name, path_params, **kwargs)

    # meta ----------------------------------------------------------------------------------------
    @recorded("check_version")
    def check_version(self) -> dict[str, Any]:
        info = self.api.version()
        if api_major(str(info.get("api_version", "0"))) != api_major(API_VERSION):
            raise errors.VersionMismatchError(
                f"the backend at {self.url} speaks API {info.get('api_version')} but this client speaks {API_VERSION};"
                " install matching versions of cortex-nb on both sides",
                code="version_mismatch",
            )
        self.backend_version = info
        return info

    def whoami(self) -> dict[str, Any]:
        return self.api.whoami()

    def get_capacity(self) -> dict[str, Any]:
        return self.api.capacity()

    def list_models(self) -> list[dict[str, Any]]:
        return self.api.list_models()["models"]

    def tokenize(self, model: str, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return self.api.tokenize(model, texts, add_special_tokens)["tokens"]

    def tokenizer_info(self, model: str) -> dict[str, Any]:
        return self.api.tokenize(model, [])

    def detokenize(self, model: str, tokens: list[list[int]]) -> list[str]:
        return self.api.detokenize(model, tokens)["texts"]

    # jobs ----------------------------------------------------------------------------------------
    def create_job(
        self,
        sub_jobs: list[dict[str, Any]],
        job_id: str | None = None,
        experiment_name: str | None = None,
        hardware: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        idle_timeout_s: float | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """`priority` 0-9 (default 5) orders the queue; see docs/api.md, Priorities."""
        return self.api.create_job(
            sub_jobs,
            job_id,
            experiment_name,
            hardware,
            name=name,
            idle_timeout_s=idle_timeout_s,
            priority=priority,
        )

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.api.get_job(job_id)

    @recorded("list_jobs")
    def list_jobs(
        self, status: str | None = None, limit: int = 100, short_lived: bool = True, **filters: Any
    ) -> list[dict[str, Any]]:
        """Newest first, at most `limit`. `filters`: `name` (a part of it), `since`/`until` (created,
        Unix seconds), `label` ("key" or "key=value"), `owner` (an admin's token only). With
        `short_lived=False`, the jobs `%cortex compare` and sampling on demand start for themselves are
        left out (and `limit` counts the others)."""
        jobs: list[dict[str, Any]] = []
        cursor = None
        while len(jobs) < limit:
            page = self.api.list_jobs(status, min(limit - len(jobs), 500), cursor, **filters)
            jobs.extend(job for job in page["jobs"] if short_lived or not is_short_lived(job))
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return jobs

    def wait_for_progress(self, job_id: str, after: float | None, wait_s: float) -> dict[str, Any]:
        """The job once its progress record is newer than `after` (its `updated_at`), its status
        changes or its place in the queue moves, or after `wait_s`: one request per update."""
        return polling.wait_for_progress(self.api, job_id, after, wait_s)

    def wait_for_job(
        self,
        job_id: str,
        until: tuple[str, ...] = (JOB_RUNNING, *JOB_TERMINAL),
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Wait until the job reaches one of `until` (default: running or finished)."""
        return polling.wait_for_job(self.api, job_id, until, timeout_s)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self.api.cancel_job(job_id)

    def complete_job(self, job_id: str) -> dict[str, Any]:
        """Free a job's device ("Free device"): it ends `done` once its queued requests finish. Trained
        steps no checkpoint holds are saved first, as checkpoint `final` (named in `saved_checkpoint`)."""
        return self.api.complete_job(job_id)

    # managed training ----------------------------------------------------------------------------
    def upload_dataset(self, data: bytes) -> str:
        """Upload JSONL training rows once; returns the dataset id (their SHA-256). Nothing is sent
        when the backend already has them."""
        from .train_data import upload_dataset

        return upload_dataset(self.api, data)

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self.api.get_dataset(dataset_id)

    def train(
        self,
        spec: Any,
        *,
        name: str | None = None,
        namespace: Mapping[str, Any] | None = None,
        experiment: str | None = None,
        idle_timeout_s: float | None = None,
        priority: int | None = None,
    ) -> TrainingJob:
        """Start a training run and return its `TrainingJob` at once: the backend runs the loop
        (batching, eval, samples, checkpoints) in the training worker, so it outlives this process.

        `spec` is a `TrainSpec`, a dict of the `%%cortex train` YAML keys, or that YAML text. Its data
        (and eval data) is a JSONL or .txt path, `$name` of a variable in `namespace`, or (in a dict) the
        rows themselves: they are uploaded once as a dataset. Watch it with `job.progress`,
        `job.history` and `job.wait()`.
        """
        return start_training(
            self,
            spec,
            name=name,
            namespace=namespace,
            experiment=experiment,
            idle_timeout_s=idle_timeout_s,
            priority=priority,
        )

    # data plane ----------------------------------------------------------------------------------
    def forward_backward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
        *,
        sub_job: str | None = None,
        router_replay: list[str] | None = None,
        record_routes: bool = False,
    ) -> str:
        """Queue a forward+backward pass; gradients accumulate until `step`. Returns the request id.
        On an MoE base, `router_replay` names per row the `routes_id` of a sample recorded with
        `record_routes` (its experts are replayed), and `record_routes` returns the experts the forward used
        as the result tensor `routed_experts` (docs/router-replay.md)."""
        return self.api.forward_backward(
            job_id,
            batch,
            loss_fn,
            loss_fn_config,
            sub_job=sub_job,
            router_replay=router_replay,
            record_routes=record_routes,
        )["request_id"]

    def forward(
        self,
        job_id: str,
        batch: Mapping[str, Any],
        *,
        adapter: str | dict[str, str] | None = None,
        loss_fn: str | None = None,
        loss_fn_config: dict[str, float] | None = None,
        sub_job: str | None = None,
        router_replay: list[str] | None = None,
        record_routes: bool = False,
    ) -> str:
        """Queue a scoring pass: log p(target_tokens) per position, no gradients. `adapter` scores with
        "base" (no adapter) or a saved checkpoint's ({"checkpoint_id", "job_id"?}) instead of the live one;
        `loss_fn` also reports that loss and its metrics (nothing is accumulated); `router_replay` and
        `record_routes` as for forward_backward."""
        return self.api.forward(
            job_id,
            batch,
            adapter=adapter,
            loss_fn=loss_fn,
            loss_fn_config=loss_fn_config,
            sub_job=sub_job,
            router_replay=router_replay,
            record_routes=record_routes,
        )["request_id"]

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
        body = step_body(learning_rate, betas=betas, eps=eps, weight_decay=weight_decay, grad_clip=grad_clip)
        return self.api.step(job_id, body, sub_job=sub_job)["request_id"]

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
        return self.api.generate(job_id, prompts, sampling_params, adapter=adapter, sub_job=sub_job)[
            "request_id"
        ]

    def reset_prefix_cache(
        self, job_id: str, *, sub_job: str | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Drop the sampling engine's cached prompt prefixes (after the sub-job's queued requests); waits
        and returns the result: `{engine, reset, cached_prefixes_dropped, detail}`."""
        request_id = self.api.reset_prefix_cache(job_id, sub_job=sub_job)["request_id"]
        return self.poll_request(job_id, request_id, timeout_s)

    def router_replay_discard(self, job_id: str, routes_ids: list[str] | None = None) -> dict[str, Any]:
        """Free routes recorded for replay (`record_routes`): the named `routes_id`s, or all of the job's.
        Returns what was freed and what the job still holds (`held_bytes`, `cap_bytes`)."""
        return self.api.router_replay_discard(job_id, routes_ids)

    def noop(self, job_id: str, *, sub_job: str | None = None) -> str:
        """A request that does nothing in the worker: measures the round trip."""
        return self.api.noop(job_id, sub_job=sub_job)["request_id"]

    # requests ------------------------------------------------------------------------------------
    def get_request_status(
        self, job_id: str, request_id: str, cursor: int = 0, wait_s: float = 0.0
    ) -> dict[str, Any]:
        return self.api.get_request(job_id, request_id, cursor, wait_s)

    def poll_request(self, job_id: str, request_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for a request to finish and return its result (with `tensors` decoded, if any).

        Raises `RequestFailed` (with the failure code) if it failed or was cancelled, and
        `TimeoutError` if waiting locally runs out; the request itself keeps running.
        """
        return polling.poll_request(self.api, job_id, request_id, timeout_s)

    def cancel_request(self, job_id: str, request_id: str) -> dict[str, Any]:
        return self.api.cancel_request(job_id, request_id)

    def list_requests(self, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
        return self.api.list_requests(job_id, limit)["requests"]

    # checkpoints and weight sync -----------------------------------------------------------------
    def save(
        self,
        job_id: str,
        checkpoint_id: str | None = None,
        checkpoint_type: str = "resumable",
        *,
        sub_job: str | None = None,
        ttl_seconds: int | None = None,
    ) -> str:
        """Queue a save of the trainer's adapter ("weights-only") or adapter + optimizer + step + RNG
        ("resumable"). The result names the checkpoint (`step-N` unless `checkpoint_id` is given); with
        `ttl_seconds` the backend deletes it that long after it is saved (unless it is in use then)."""
        return self.api.save(
            job_id, checkpoint_id, checkpoint_type, sub_job=sub_job, ttl_seconds=ttl_seconds
        )["request_id"]

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
        return self.api.load(
            job_id, checkpoint_id, source_job_id, target_sub_job_id, restore_optimizer=restore_optimizer
        )["request_id"]

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
        return self.api.weight_sync(job_id, source_sub_job_id, target_sub_job_ids, weight_format)[
            "request_id"
        ]

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        """The job's valid checkpoints, oldest first (a finished job's too)."""
        return self.api.list_checkpoints(job_id)["checkpoints"]

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        return self.api.get_checkpoint(job_id, checkpoint_id)

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        """Delete a checkpoint; refused (ConflictError, `checkpoint_in_use`) while a load or export reads it."""
        return self.api.delete_checkpoint(job_id, checkpoint_id)

    def set_checkpoint_ttl(self, job_id: str, checkpoint_id: str, ttl_seconds: int | None) -> dict[str, Any]:
        """Expire the checkpoint `ttl_seconds` from now (at least the backend's shortest, 1 hour by default), or
        never (None). An expired checkpoint is deleted by the backend once nothing uses it."""
        return self.api.update_checkpoint(job_id, checkpoint_id, {"ttl_seconds": ttl_seconds})

    def publish_checkpoint(self, job_id: str, checkpoint_id: str, public: bool = True) -> dict[str, Any]:
        """Let every token of the backend load and sample the checkpoint (public=False takes that back)."""
        return self.api.update_checkpoint(job_id, checkpoint_id, {"public": public})

    def copy_checkpoint(
        self, job_id: str, checkpoint_id: str, ttl_seconds: int | None = None
    ) -> dict[str, Any]:
        """Copy a checkpoint you may read (yours, or a published one) into a new job of yours, which holds it
        and cannot be trained on; the copy outlives the source."""
        return self.api.copy_checkpoint(job_id, checkpoint_id, ttl_seconds)

    def export_checkpoint(
        self, job_id: str, checkpoint_id: str, dest: str | Path, *, contents: str = "adapter"
    ) -> Path:
        """Download a checkpoint into `dest` (a new or empty directory): a PEFT adapter directory
        (`adapter_config.json` + `adapter_model.safetensors` + `manifest.json`), or with
        `contents="all"` every file of the checkpoint. Every file's SHA-256 is checked on arrival;
        nothing is left in `dest` if one does not match."""
        from .checkpoint_files import download_checkpoint

        return download_checkpoint(self.api, job_id, checkpoint_id, dest, contents=contents)

    # logs ----------------------------------------------------------------------------------------
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
        return self.api.job_logs(job_id, cursor or 0, limit, sub_job, wait_s)

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
    def get_job_metrics(self, job_id: str, since: float | None = None, limit: int = 1000) -> dict[str, Any]:
        """One page of device samples of a job: {samples, next_since, gpu_unavailable_reason, ...}."""
        return self.api.job_metrics(job_id, since, limit)

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

    def metrics_df(self, job_id: str) -> pd.DataFrame:
        """A job's device samples as a pandas DataFrame (GPU columns only where GPUs were sampled)."""
        from .views import metrics_frame

        return metrics_frame(self.job_metric_samples(job_id))

    def host_metrics(self, since: float | None = None) -> dict[str, Any]:
        """The backend host's newest sample per device: {samples, devices, gpu_unavailable_reason, ...}."""
        return self.api.host_metrics(since)

    def list_events(self, after: int = 0, limit: int = 100, wait_s: float = 0.0) -> dict[str, Any]:
        """Job and request state changes after `after`: {events, cursor}. With `wait_s`, wait up to
        that long for the first one. Reading removes nothing: ask again from the same cursor at will."""
        return self.api.list_events(after, limit, wait_s)

    # source runs ---------------------------------------------------------------------------------
    def run(
        self,
        spec: str | Path | Mapping[str, Any],
        *,
        submission_id: str | None = None,
        base_dir: str | Path | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> RunHandle:
        """Run your own code on the backend host: a `cortex.yaml` path (or a spec mapping) -> `RunHandle`.

        The included files and inputs are captured with a SHA-256 manifest and uploaded; this returns once
        the backend has verified them and queued the run. If the answer is lost, `SubmissionOutcomeUnknown`
        names the submission id to `resume`; the same submission id never runs twice.
        """
        return start_run(self, spec, submission_id=submission_id, base_dir=base_dir, files=files)

    def resume(self, submission_id: str) -> RunHandle:
        """The run a submission id created (after `SubmissionOutcomeUnknown`); `NotFoundError` if none was."""
        return resume_run(self, submission_id)

    def run_handle(self, run_id: str) -> RunHandle:
        """Attach to an existing run."""
        return RunHandle(self, self.get_run(run_id))

    def speedtest(self, size_mb: float = 8.0, pings: int = 5) -> dict[str, float]:
        """Measure the link to the backend: `latency_ms` (median of `pings` round trips), `download_mb_s`
        and `upload_mb_s` (`size_mb` MB each way, at most 32 MiB; MB = 10^6 bytes). Later uploads larger
        than `api.eta_threshold_bytes` print an ETA from these figures."""
        from .link_speed import measure

        return measure(self, int(size_mb * 1e6), pings)

    def stats(
        self, since: float | None = None, until: float | None = None, owner: str | None = None
    ) -> dict[str, Any]:
        """Jobs and runs by state, queue wait (median, p95) and device-seconds per owner and per model over
        [since, until) (default: the last 7 days); `owner` only with an admin's token."""
        return self.api.stats(since, until, owner)

    def stats_frame(
        self, since: float | None = None, until: float | None = None, owner: str | None = None
    ) -> pd.DataFrame:
        """`stats` as a DataFrame: one row per figure (section, name, value)."""
        from .views import stats_frame

        return stats_frame(self.stats(since, until, owner))

    def history(self, limit: int = 20) -> pd.DataFrame:
        """Recent runs, newest first, as a pandas DataFrame."""
        from .views import runs_frame

        return runs_frame(self.list_runs(limit=limit))

    def get_run(self, run_id: str, wait_s: float = 0.0, while_status: str | None = None) -> dict[str, Any]:
        return self.api.get_run(run_id, wait_s, while_status)

    def list_runs(
        self, status: str | None = None, limit: int = 50, submission_id: str | None = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Newest first, at most `limit`; `filters` as `list_jobs` takes them."""
        runs: list[dict[str, Any]] = []
        cursor = None
        while len(runs) < limit:
            page = self.api.list_runs(status, min(limit - len(runs), 500), cursor, submission_id, **filters)
            runs.extend(page["runs"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return runs

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return self.api.cancel_run(run_id)

    def run_logs(
        self, run_id: str, cursor: int = 0, limit: int = 1000, wait_s: float = 0.0
    ) -> dict[str, Any]:
        return self.api.run_logs(run_id, cursor, limit, wait_s)

    def run_report(self, run_id: str) -> dict[str, Any]:
        return self.api.run_report(run_id)

    def list_run_outputs(self, run_id: str) -> dict[str, Any]:
        return self.api.list_run_outputs(run_id)

    def download_run_output(
        self, run_id: str, name: str, dest: str | Path, expected: dict[str, Any] | None = None
    ) -> Path:
        """Save one output at `dest` after checking its length and SHA-256 against the backend's record."""
        return download_output(self.api, run_id, name, dest, expected)

    # higher-level objects ------------------------------------------------------------------------
    def create_training_job(self, base_model: str = "tiny", **kwargs: Any) -> TrainingJob:
        """A `TrainingJob` (training sub-job, plus `samplers` sampling sub-jobs)."""
        return TrainingJob.create(self, base_model, **kwargs)

    def create_sampler(self, base_model: str = "tiny", **kwargs: Any) -> Sampler:
        return Sampler.create(self, base_model, **kwargs)

    def training_job(self, job_id: str) -> TrainingJob:
        """Attach to an existing job."""
        return TrainingJob(self, self.get_job(job_id))
