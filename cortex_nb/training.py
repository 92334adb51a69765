"""Tinker-style objects over the client: a `TrainingJob` (trainer, optional samplers) and a `Sampler`.

Each call returns an `APIFuture` immediately; `.result()` waits. Use a job as a context manager to
complete it (freeing its device) when the block ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import errors, polling
from .api import Api, CompletedJob, HasApi, JobLogPage, JobRow, api_of
from .batching import next_token_batch
from .checkpoint_files import download_checkpoint
from .futures import APIFuture, ResolvedFuture
from .protocol.schemas.sampling import SAMPLING_KEYS
from .protocol.states import (
    JOB_FAILED,
    JOB_RUNNING,
    JOB_TERMINAL,
    LOG_PROBABILITY,
    PHASE_KEEP_ALIVE,
    SAMPLING,
    SHORT_LIVED,
    TRAINING,
)
from .reconnect import Reconnect, backend_away, riding_through
from .token_stream import TokenStream

if TYPE_CHECKING:
    import pandas as pd


class GenerateResult:
    """The samples of one generate call, in prompt order (`n` samples per prompt)."""

    def __init__(self, raw: dict[str, Any], prompts: Sequence[Any]) -> None:
        self.raw = raw
        self.prompts = list(prompts)
        self.samples: list[dict[str, Any]] = raw["samples"]
        self.weight_version: int | None = raw.get("weight_version")
        self.seed = raw.get("seed")
        # The engine that sampled: "transformers" (built in) or "vllm" (see the backend's --sampler).
        self.sampler: str | None = raw.get("sampler")
        # Per prompt, log p(token t | tokens before it) for t >= 1, when asked for with prompt_logprobs=True.
        self.prompt_logprobs: list[list[float]] | None = raw.get("prompt_logprobs")
        # Set when a job that had ended was sampled on demand (cortex_nb.on_demand): the checkpoint
        # whose weights answered, the job it belongs to, and the short-lived sampling job that ran it.
        self.checkpoint_id: str | None = None
        self.source_job_id: str | None = None
        self.sampling_job_id: str | None = None

    @property
    def texts(self) -> list[str]:
        return [sample["text"] for sample in self.samples]

    @property
    def tokens(self) -> list[list[int]]:
        return [sample["tokens"] for sample in self.samples]

    def to_dataframe(self) -> pd.DataFrame:
        from .views import samples_frame

        return samples_frame(self)

    def __repr__(self) -> str:
        engine = f", sampler {self.sampler}" if self.sampler else ""
        weights = f"weights v{self.weight_version}"
        if self.checkpoint_id:
            weights = f"checkpoint {self.checkpoint_id} of {self.source_job_id} ({weights})"
        return f"<GenerateResult {len(self.samples)} sample(s) from {len(self.prompts)} prompt(s), {weights}{engine}>"

    def provenance(self) -> str:
        """Which weights answered, in words (what `%%cortex sample` prints under its table)."""
        if self.checkpoint_id:
            return (
                f"job {self.source_job_id} has ended: sampled its checkpoint {self.checkpoint_id!r}"
                f" (weights v{self.weight_version}) in the short-lived sampling job {self.sampling_job_id}"
            )
        return f"sampled weights v{self.weight_version}"


H = TypeVar("H", bound="_JobHandle")


class _JobHandle:
    """A job on the backend. `client` is what it was made with (a `Client`, or the `Api` itself); its
    calls go through that one's `api`. `info` holds the job as last seen."""

    def __init__(self, client: Api | HasApi, job: dict[str, Any]) -> None:
        self.client = client
        self.api = api_of(client)
        self.job_id: str = job["job_id"]
        self.info = job

    @property
    def base_model(self) -> str:
        return self.info["sub_jobs"][0]["base_model"]

    def sub_jobs(self, kind: str) -> list[str]:
        return [sub["sub_job_id"] for sub in self.info["sub_jobs"] if sub["type"] == kind]

    def refresh(self) -> JobRow:
        self.info = self.api.get_job(self.job_id)
        return self.info

    @property
    def status(self) -> str:
        return self.refresh()["status"]

    def wait_ready(self, timeout_s: float | None = None) -> JobRow:
        """Wait until the workers are up (or the job ended); raises if it failed to start."""
        self.info = polling.wait_for_job(self.api, self.job_id, (JOB_RUNNING, *JOB_TERMINAL), timeout_s)
        if self.info["status"] in JOB_TERMINAL:
            raise errors.RequestFailed(
                f"job {self.job_id} ended {self.info['status']} before it was ready: {self.info.get('failure_message')}",
                code=self.info.get("failure_code") or self.info["status"],
            )
        return self.info

    def cancel(self) -> JobRow:
        self.info = self.api.cancel_job(self.job_id)
        return self.info

    def complete(self, wait: bool = False, timeout_s: float | None = None) -> CompletedJob:
        """Free the job's device once its queued requests ran. A trained adapter no checkpoint holds is
        saved first as checkpoint `final` (the answer's `saved_checkpoint` names it). The backend
        answers at once and finishes the job when its queue drained; `wait=True` returns only once the
        job has ended (`final` saved), so a caller may stop the backend right after."""
        completed = self.api.complete_job(self.job_id)
        if wait and completed["status"] not in JOB_TERMINAL:
            ended = polling.wait_for_job(self.api, self.job_id, JOB_TERMINAL, timeout_s)
            completed = {**ended, "saved_checkpoint": completed.get("saved_checkpoint")}
        self.info = completed
        return completed

    def logs(self, cursor: int | None = None, limit: int = 1000) -> JobLogPage:
        return self.api.job_logs(self.job_id, cursor or 0, limit)

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Leaving the block means the job is over: completing waits until `final` is saved and the
        # job is done, so code after the block (stopping a local backend) cannot cut the save short.
        if self.info.get("status") not in JOB_TERMINAL:
            if exc_type is KeyboardInterrupt:
                self.cancel()
            else:
                self.complete(wait=True)

    # shared data-plane helpers -----------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        *,
        adapter: str | dict[str, str] | None = None,
        sub_job: str | None = None,
        **sampling: Any,
    ) -> APIFuture[GenerateResult]:
        """Sample. `adapter="base"` or `adapter={"checkpoint_id": ...}` samples from the base model or a saved
        checkpoint instead of the live adapter. On a job that has ended (its device freed), the answer
        comes from its checkpoint `final` (else its latest) through a short-lived sampling job; the
        result's `checkpoint_id` and `weight_version` name the weights."""
        unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
        if unknown:
            raise TypeError(f"unknown sampling parameter(s) {unknown}; allowed: {list(SAMPLING_KEYS)}")
        prompts = [p if isinstance(p, str) else list(p) for p in prompts]
        try:
            request_id = self.api.generate(self.job_id, prompts, sampling, adapter=adapter, sub_job=sub_job)[
                "request_id"
            ]
        except errors.CortexError as exc:
            if exc.code != "job_finished" or sub_job is not None or adapter == "base":
                raise
            return self._generate_after_end(prompts, sampling, adapter, exc)
        return APIFuture(
            self.api, self.job_id, request_id, "generate", lambda raw: GenerateResult(raw, prompts)
        )

    def generate_stream(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        *,
        adapter: str | dict[str, str] | None = None,
        sub_job: str | None = None,
        **sampling: Any,
    ) -> TokenStream:
        """`generate`, streamed: iterate the returned `TokenStream` for each sample's tokens (with their
        logprobs and text) as they are decoded; its `result` is then what `generate` returns. A job that
        has ended streams from its checkpoint, sampled on demand as `generate` does."""
        unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
        if unknown:
            raise TypeError(f"unknown sampling parameter(s) {unknown}; allowed: {list(SAMPLING_KEYS)}")
        prompts = [p if isinstance(p, str) else list(p) for p in prompts]
        on_demand = sub_job is None and adapter != "base"
        return TokenStream(
            self.api,
            self.job_id,
            prompts,
            sampling,
            adapter=adapter,
            sub_job=sub_job,
            result_type=GenerateResult,
            after_end=(lambda refused: self._stream_after_end(prompts, sampling, adapter, refused))
            if on_demand
            else None,
        )

    def _ended_job(self, refused: errors.CortexError) -> dict[str, Any]:
        """The job, once it has ended (waiting while it completes); `refused` again if it still runs."""
        from .on_demand import ended_job

        job = ended_job(self.api, self.job_id)
        if job is None:
            raise refused
        self.info = job
        return job

    def _stream_after_end(
        self,
        prompts: list[Any],
        sampling: dict[str, Any],
        adapter: str | dict[str, str] | None,
        refused: errors.CortexError,
    ) -> Iterator[dict[str, Any]]:
        """`generate_stream` on a job that has ended: its checkpoint streamed from a short-lived sampler."""
        job = self._ended_job(refused)
        checkpoint = adapter.get("checkpoint_id") if isinstance(adapter, dict) else None
        return stream_checkpoint(self.api, job, prompts, sampling, checkpoint)

    def _generate_after_end(
        self,
        prompts: list[Any],
        sampling: dict[str, Any],
        adapter: str | dict[str, str] | None,
        refused: errors.CortexError,
    ) -> ResolvedFuture[GenerateResult]:
        """The job has ended (or is completing): sample its checkpoint (`final`, else its latest, or
        the one `adapter` names) in a short-lived sampling job instead of refusing."""
        job = self._ended_job(refused)
        checkpoint = adapter.get("checkpoint_id") if isinstance(adapter, dict) else None
        return ResolvedFuture(sample_checkpoint(self.api, job, prompts, sampling, checkpoint), "generate")

    def forward(
        self,
        batch: Mapping[str, Any],
        *,
        adapter: str | dict[str, str] | None = None,
        sub_job: str | None = None,
        **loss: Any,
    ) -> APIFuture[dict[str, Any]]:
        """Score a batch without gradients (`loss_fn=...` adds that loss's value and metrics)."""
        submitted = self.api.forward(self.job_id, batch, adapter=adapter, sub_job=sub_job, **loss)
        return APIFuture(self.api, self.job_id, submitted["request_id"], "forward")

    def compute_logprobs(
        self, sequences: Sequence[Sequence[int]], *, sub_job: str | None = None
    ) -> APIFuture[list[np.ndarray]]:
        """log p(token t | tokens < t) for t >= 1 of each sequence (one array per sequence, length len-1)."""
        lengths = [len(seq) - 1 for seq in sequences]
        batch = next_token_batch(sequences)
        request_id = self.api.forward(self.job_id, batch, sub_job=sub_job)["request_id"]

        def split(raw: dict[str, Any]) -> list[np.ndarray]:
            logprobs = raw["tensors"]["logprobs"]
            return [logprobs[i, :n] for i, n in enumerate(lengths)]

        return APIFuture(self.api, self.job_id, request_id, "forward", split)

    # checkpoints ---------------------------------------------------------------------------------
    def load(
        self,
        checkpoint_id: str,
        source_job_id: str | None = None,
        target_sub_job_id: str | None = None,
        *,
        restore_optimizer: bool = True,
    ) -> APIFuture[dict[str, Any]]:
        """Load a checkpoint of this job (or of `source_job_id`, another job of yours) into a sub-job."""
        submitted = self.api.load(
            self.job_id, checkpoint_id, source_job_id, target_sub_job_id, restore_optimizer=restore_optimizer
        )
        return APIFuture(self.api, self.job_id, submitted["request_id"], "load")

    def checkpoints(self) -> pd.DataFrame:
        """This job's checkpoints as a table, oldest first."""
        from .views import checkpoints_frame

        return checkpoints_frame(self.api.list_checkpoints(self.job_id)["checkpoints"])


class TrainingJob(_JobHandle):
    """A training sub-job (base model + LoRA + AdamW), with optional sampling sub-jobs."""

    @classmethod
    def create(
        cls,
        client: Api | HasApi,
        base_model: str = "tiny",
        *,
        lora: dict[str, Any] | None = None,
        optimizer: dict[str, Any] | None = None,
        samplers: int = 0,
        max_seq_len: int | None = None,
        seed: int = 0,
        name: str | None = None,
        experiment: str | None = None,
        job_id: str | None = None,
        idle_timeout_s: float | None = None,
        gradient_checkpointing: bool = False,
        n_gpus: int = 1,
        sampler_gpus: int = 1,
        wait: bool = True,
    ) -> TrainingJob:
        trainer = {
            "type": TRAINING,
            "base_model": base_model,
            "lora": lora or {},
            "optimizer": optimizer or {},
            "seed": seed,
        }
        if max_seq_len:
            trainer["max_seq_len"] = max_seq_len
        if gradient_checkpointing:
            trainer["gradient_checkpointing"] = True
        if n_gpus != 1:  # ranks with FSDP2 over n_gpus devices (CPU slots on a CPU backend)
            trainer["n_gpus"] = n_gpus
        subs = [trainer] + [
            {
                "type": SAMPLING,
                "base_model": base_model,
                "seed": seed,
                **({"max_seq_len": max_seq_len} if max_seq_len else {}),
                # one vLLM engine across this many devices (tensor parallelism; vLLM backends only)
                **({"n_gpus": sampler_gpus} if sampler_gpus != 1 else {}),
            }
            for _ in range(samplers)
        ]
        job = cls(
            client,
            api_of(client).create_job(
                subs, job_id=job_id, experiment=experiment, name=name, idle_timeout_s=idle_timeout_s
            ),
        )
        if wait:
            job.wait_ready()
        return job

    def forward_backward(
        self,
        batch: Mapping[str, Any],
        loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, float] | None = None,
    ) -> APIFuture[dict[str, Any]]:
        submitted = self.api.forward_backward(self.job_id, batch, loss_fn, loss_fn_config)
        return APIFuture(self.api, self.job_id, submitted["request_id"], "forward_backward")

    def step(self, learning_rate: float | None = None, **hyperparameters: Any) -> APIFuture[dict[str, Any]]:
        """Apply the accumulated gradients. `betas`, `eps`, `weight_decay`, `grad_clip` may be given per step."""
        sub_job = hyperparameters.pop("sub_job", None)
        submitted = self.api.step(self.job_id, step_body(learning_rate, **hyperparameters), sub_job=sub_job)
        return APIFuture(self.api, self.job_id, submitted["request_id"], "step")

    # checkpoints and weight sync -------------------------------------------------------------------
    def save(
        self, checkpoint_id: str | None = None, checkpoint_type: str = "resumable"
    ) -> APIFuture[dict[str, Any]]:
        """Save the trainer: "resumable" (adapter, optimizer, step, RNG) or "weights-only" (the adapter).
        The result's `checkpoint_id` names it (`step-N` unless given)."""
        submitted = self.api.save(self.job_id, checkpoint_id, checkpoint_type)
        return APIFuture(self.api, self.job_id, submitted["request_id"], "save")

    def export(
        self, dest: str | Path, checkpoint_id: str | None = None, *, contents: str = "adapter"
    ) -> Path:
        """Download a PEFT adapter directory into `dest` (hashes checked). Without `checkpoint_id`, the
        trainer's current adapter is saved first (weights-only) and that checkpoint is exported."""
        if checkpoint_id is None:
            checkpoint_id = self.save(checkpoint_type="weights-only").result()["checkpoint_id"]
        return download_checkpoint(self.api, self.job_id, checkpoint_id, dest, contents=contents)

    def sync_sampler(
        self, targets: Sequence[str] | None = None, weight_format: str = "lora"
    ) -> APIFuture[dict[str, Any]]:
        """Send the trainer's current weights to this job's sampling sub-jobs (or `targets`). Requests
        queued before the sync see the old weights; those queued after it see the new ones."""
        submitted = self.api.weight_sync(
            self.job_id, None, list(targets) if targets is not None else None, weight_format
        )
        return APIFuture(self.api, self.job_id, submitted["request_id"], "weight_sync")

    # training runs (Client.train) and any training's progress ----------------------------------------
    @property
    def progress(self) -> dict[str, Any] | None:
        """The backend's progress record of this job, refreshed: step, loss per token, eval loss, ETA,
        last checkpoint... (None before its first step)."""
        return self.refresh().get("progress")

    @property
    def history(self) -> pd.DataFrame:
        """The loss curve as the backend keeps it (at most 256 points, decimated on long runs): step,
        loss_per_token, eval_loss_per_token."""
        from .views import history_frame

        return history_frame(self.refresh().get("progress"))

    def wait(
        self, timeout_s: float | None = None, on_update: Callable[[dict[str, Any]], None] | None = None
    ) -> JobRow:
        """Block until training ends: the job done, failed or cancelled, or sampling in its keep-alive.
        Returns the job; raises `RequestFailed` (with the failure code) if it failed, `TimeoutError` if
        `timeout_s` passes first (the run goes on). `on_update(job)` sees each update."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # A backend restart is ridden through (reconnect.py): a training run resumes by itself.
        reconnect = Reconnect(self.api.poll.reconnect_s)
        job = riding_through(self.refresh, self.api.poll.reconnect_s)
        while not training_over(job):
            if on_update is not None:
                on_update(job)
            remaining = self.api.poll.long_poll_s if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise errors.TimeoutError(
                    f"job {self.job_id} is still training after waiting; it keeps going", code="timeout"
                )
            updated = (job.get("progress") or {}).get("updated_at")
            try:
                job = self.info = polling.wait_for_progress(
                    self.api, self.job_id, updated, min(remaining, self.api.poll.long_poll_s)
                )
            except errors.CortexError as exc:
                if not backend_away(exc):
                    raise
                reconnect.wait(exc)
                continue
            reconnect.back()
        if on_update is not None:
            on_update(job)
        if job["status"] == JOB_FAILED:
            raise errors.RequestFailed(
                f"job {self.job_id} failed: {job.get('failure_message') or job.get('failure_code')}",
                code=job.get("failure_code") or JOB_FAILED,
                detail={"job": job},
            )
        return job

    def __repr__(self) -> str:
        return f"<TrainingJob {self.job_id} {self.base_model} {self.info.get('status')}>"


def training_over(job: dict[str, Any]) -> bool:
    """Has the job's training ended: finished, failed or cancelled, or sampling after it (keep-alive)?"""
    progress = job.get("progress") or {}
    return job["status"] in JOB_TERMINAL or progress.get("phase") == PHASE_KEEP_ALIVE


class Sampler(_JobHandle):
    """A job with one sampling (or log-probability) sub-job on a base model."""

    @classmethod
    def create(
        cls,
        client: Api | HasApi,
        base_model: str = "tiny",
        *,
        lora: dict[str, Any] | None = None,
        kind: str = SAMPLING,
        max_seq_len: int | None = None,
        seed: int = 0,
        name: str | None = None,
        wait: bool = True,
        labels: Mapping[str, str] | None = None,
        n_gpus: int = 1,
    ) -> Sampler:
        """`n_gpus` > 1: one vLLM engine across that many devices (tensor parallelism; vLLM backends only)."""
        if kind not in (SAMPLING, LOG_PROBABILITY):
            raise ValueError(f"kind must be {SAMPLING!r} or {LOG_PROBABILITY!r}")
        sub = {"type": kind, "base_model": base_model, "lora": lora or {}, "seed": seed}
        if max_seq_len:
            sub["max_seq_len"] = max_seq_len
        if n_gpus != 1:
            sub["n_gpus"] = n_gpus
        sampler = cls(client, api_of(client).create_job([sub], name=name, labels=labels))
        if wait:
            sampler.wait_ready()
        return sampler

    def __repr__(self) -> str:
        return f"<Sampler {self.job_id} {self.base_model} {self.info.get('status')}>"


def step_body(
    learning_rate: float | None = None,
    *,
    betas: tuple[float, float] | None = None,
    eps: float | None = None,
    weight_decay: float | None = None,
    grad_clip: float | None = None,
) -> dict[str, Any]:
    """A step's body: the hyperparameters given for this step only (the others are the job's)."""
    given = {
        "learning_rate": learning_rate,
        "betas": list(betas) if betas is not None else None,
        "eps": eps,
        "weight_decay": weight_decay,
        "grad_clip": grad_clip,
    }
    return {key: value for key, value in given.items() if value is not None}


def start_training(
    client: Api | HasApi,
    spec: Any,
    *,
    name: str | None = None,
    namespace: Mapping[str, Any] | None = None,
    experiment: str | None = None,
    idle_timeout_s: float | None = None,
    priority: int | None = None,
) -> TrainingJob:
    """Start a training run (`Client.train`): its data uploaded once as datasets, its loop run by
    the backend in the training worker. Returns the `TrainingJob` at once."""
    from .train_data import examples_to_jsonl, load_examples, upload_dataset
    from .train_spec import TrainSpec, spec_from

    spec, data_rows, eval_rows = spec_from(spec)
    if not isinstance(spec, TrainSpec):
        raise TypeError("spec must be a TrainSpec, a dict of train-spec keys or YAML text")
    namespace = dict(namespace or {})
    if data_rows is not None:
        namespace["__cortex_data__"], spec.data = data_rows, "$__cortex_data__"
    if eval_rows is not None and spec.eval is not None:
        namespace["__cortex_eval__"], spec.eval.data = eval_rows, "$__cortex_eval__"
    api = api_of(client)
    dataset_id = upload_dataset(api, examples_to_jsonl(load_examples(spec.data, namespace, "data")))
    eval_id = None
    if spec.eval is not None:
        eval_id = upload_dataset(
            api, examples_to_jsonl(load_examples(spec.eval.data, namespace, "eval.data"))
        )
    job = api.create_job(
        [spec.sub_job()],
        name=name,
        experiment=experiment,
        idle_timeout_s=idle_timeout_s,
        training_loop=spec.training_loop(dataset_id, eval_id),
        priority=priority,
    )
    return TrainingJob(client, job)


def sample_checkpoint(
    api: Api,
    job: dict[str, Any],
    prompts: Sequence[Any],
    sampling: dict[str, Any],
    checkpoint_id: str | None = None,
) -> GenerateResult:
    """Generate from `checkpoint_id` of `job` (default: `sampling_checkpoint`) in a sampling job of its
    own, completed before returning. The result names the checkpoint and the sampling job."""
    sampler, checkpoint_id = checkpoint_sampler(api, job, checkpoint_id)
    try:
        raw = dict(sampler.generate(prompts, **sampling).result().raw)
    finally:
        sampler.complete()
    return named_result(GenerateResult(raw, prompts), job, checkpoint_id, sampler)


def stream_checkpoint(
    api: Api,
    job: dict[str, Any],
    prompts: Sequence[Any],
    sampling: dict[str, Any],
    checkpoint_id: str | None = None,
) -> Generator[dict[str, Any], None, GenerateResult]:
    """`sample_checkpoint`, streamed: yields the sampling job's token pieces as they are decoded and
    returns the result. The sampling job is completed however the iteration ends."""
    sampler, checkpoint_id = checkpoint_sampler(api, job, checkpoint_id)
    try:
        stream = sampler.generate_stream(prompts, **sampling)
        try:
            yield from stream
        finally:
            stream.close()
    finally:
        sampler.complete()
    return named_result(stream.result, job, checkpoint_id, sampler)


def checkpoint_sampler(api: Api, job: dict[str, Any], checkpoint_id: str | None) -> tuple[Sampler, str]:
    """A short-lived sampling job on `job`'s base model with its checkpoint (default:
    `sampling_checkpoint`) loaded, ready for requests; the caller completes it."""
    from .on_demand import sampling_checkpoint

    trainer = next((sub for sub in job["sub_jobs"] if sub["type"] == TRAINING), None)
    if trainer is None:
        raise errors.CortexError(
            f"job {job['job_id']} has no training sub-job whose weights could be sampled", code="job_finished"
        )
    checkpoint_id = checkpoint_id or sampling_checkpoint(api, job)
    sub = {
        "type": SAMPLING,
        "base_model": trainer["base_model"],
        "lora": trainer.get("lora") or {},
        "seed": trainer.get("seed", 0),
    }
    if trainer.get("max_seq_len"):
        sub["max_seq_len"] = trainer["max_seq_len"]
    sampler = Sampler(
        api, api.create_job([sub], name=f"sample {job['job_id']}", labels=SHORT_LIVED["sample"])
    )
    try:
        sampler.wait_ready()
        sampler.load(checkpoint_id, job["job_id"]).result()
    except BaseException:
        sampler.complete()
        raise
    return sampler, checkpoint_id


def named_result(
    result: GenerateResult, job: dict[str, Any], checkpoint_id: str, sampler: Sampler
) -> GenerateResult:
    """A result sampled on demand names the checkpoint, the run it came from and the sampling job."""
    result.checkpoint_id = checkpoint_id
    result.source_job_id = job["job_id"]
    result.sampling_job_id = sampler.job_id
    return result
