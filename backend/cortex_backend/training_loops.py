"""Managed training runs, the service's side: a job created with a `training_loop` trains by itself.

At creation the loop spec is checked with the kernel's own definition (`cortex_nb.train_spec`) and its
datasets must be the owner's. Once the job runs, the loop is queued on its training sub-job as one
request (`train_loop`, with the datasets' bytes), so it is listed, keeps the job busy, and any
executor runs it like any other request. The worker reports each step, eval, sample and checkpoint
(`loop` messages): they land in the job's progress record, and checkpoints are made valid as a save
request's would be. When the loop ends the job completes (freeing its device), unless the spec keeps
it alive for sampling; a failed loop fails the job with its code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.train_spec import SpecError, parse_training_loop

from .auth import Principal
from .checkpoints import CheckpointManager
from .data_plane import RequestManager
from .datasets import DatasetStore
from .jobs import JobManager
from .models import ModelCatalog
from .progress import ProgressBook
from .store import Store
from .validation import validate_prompts

log = logging.getLogger("cortex_backend.training_loops")


def loop_spec(job: dict[str, Any]) -> dict[str, Any] | None:
    """A job's normalised `training_loop`, or None for a job driven by its client."""
    return job["spec"].get("training_loop")


class TrainingLoops:
    def __init__(
        self,
        store: Store,
        catalog: ModelCatalog,
        jobs: JobManager,
        requests: RequestManager,
        checkpoints: CheckpointManager,
        datasets: DatasetStore,
        progress: ProgressBook,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.jobs = jobs
        self.requests = requests
        self.checkpoints = checkpoints
        self.datasets = datasets
        self.progress = progress
        self.log_line = log_line
        # job id -> the id of its running `train_loop` request
        self._loops: dict[str, str] = {}
        jobs.validators.append(self.validate)
        jobs.on_job_running.append(self.start)
        jobs.on_job_ended.append(lambda job_id, *_: self._loops.pop(job_id, None))

    # creation --------------------------------------------------------------------------------------
    def validate(self, principal: Principal, spec: dict[str, Any]) -> dict[str, Any]:
        """Check a job's `training_loop` (if any) and return the spec with it normalised."""
        raw = spec.get("training_loop")
        if raw is None:
            return spec
        try:
            loop = parse_training_loop(raw)
        except SpecError as exc:
            field = "training_loop" + (f".{exc.field}" if exc.field else "")
            raise ApiError(
                "invalid_field",
                f"training_loop.{exc.message}" if exc.field else f"training_loop: {exc.message}",
                {"field": field},
            ) from None
        trainers = [sub for sub in spec["sub_jobs"] if sub["type"] == states.TRAINING]
        if len(spec["sub_jobs"]) != 1 or len(trainers) != 1:
            raise ApiError(
                "invalid_field",
                "training_loop: a managed training run has exactly one sub-job, of type"
                " training; create samplers as jobs of their own",
                {"field": "sub_jobs"},
            )
        self.datasets.get(principal, loop.data)
        if loop.eval is not None:
            self.datasets.get(principal, loop.eval.data)
        if loop.sample is not None:
            info = self.catalog.get(trainers[0]["base_model"])
            limit = int(trainers[0].get("max_seq_len") or info.max_positions or 2048)
            try:
                validate_prompts(loop.sample.prompts, self.catalog, info, loop.sample.max_tokens, limit)
            except ApiError as exc:
                field = "training_loop.sample." + str(exc.detail.get("field", "prompts"))
                raise ApiError(exc.code, f"training_loop.sample.{exc.message}", {"field": field}) from None
        return {**spec, "training_loop": loop.training_loop(loop.data, loop.eval.data if loop.eval else None)}

    # running ---------------------------------------------------------------------------------------
    def start(self, job_id: str) -> None:
        """The job's workers are up: queue its loop on the trainer."""
        job = self.store.get_job(job_id)
        loop = loop_spec(job) if job is not None else None
        if loop is None:
            return
        spec = parse_training_loop(loop)
        train = self.datasets.read(job["owner"], spec.data)
        held_out = self.datasets.read(job["owner"], spec.eval.data) if spec.eval else b""
        record = self.progress.start(job_id, states.PROGRESS_MANAGED)
        record.set_phase(states.PHASE_TRAINING)
        self.progress.changed(job_id, persist=True)
        params = {
            "spec": loop,
            "data_bytes": len(train),
            "checkpoint_dir": str(self.checkpoints.job_dir(job["owner"], job_id)),
        }
        self._loops[job_id] = self.requests.submit_for_service(job, "train_loop", params, train + held_out)

    def stop(self, job_id: str) -> bool:
        """Ask the loop to stop after its current step (it saves `final` first); False if none runs."""
        request_id = self._loops.get(job_id)
        if request_id is None:
            return False
        self.requests.cancel_for_service(job_id, request_id)
        return True

    def keep_alive_s(self, job: dict[str, Any]) -> float:
        loop = loop_spec(job)
        return float(loop.get("keep_alive_s") or 0.0) if loop else 0.0

    # what the worker reports -----------------------------------------------------------------------
    def on_message(self, job_id: str, sub_job_id: str, header: dict[str, Any]) -> None:
        job = self.store.get_job(job_id)
        record = self.progress.get(job_id)
        if job is None or record is None or job["status"] in states.JOB_TERMINAL:
            return
        event = header.get("event")
        persist = False
        if event == "started":
            record.total_steps = int(header["total_steps"])
            persist = True
        elif event == "step":
            record.record_forward_backward(
                header["loss"], header["weights"], header["tokens"], header.get("at")
            )
            record.record_step(header["step"], header.get("at"))
        elif event == "eval":
            record.record_eval(header["step"], header["loss"], header["weights"])
        elif event == "samples":
            record.record_samples(header["step"], header["items"])
        elif event == "checkpoint":
            self._adopt_checkpoint(job, sub_job_id, header)
            persist = True
        elif event == "ended":
            self._ended(job, header)
            return
        self.progress.changed(job_id, persist=persist)

    def _adopt_checkpoint(self, job: dict[str, Any], sub_job_id: str, header: dict[str, Any]) -> None:
        try:
            row = self.checkpoints.adopt(
                header["request_id"],
                job,
                sub_job_id,
                header["checkpoint_id"],
                header["checkpoint_type"],
                header["directory"],
                header["manifest"],
            )
        except ApiError as exc:
            self.log_line(
                job["id"],
                f"[system] checkpoint {header['checkpoint_id']} was not kept: [{exc.code}] {exc.message}",
            )
            return
        self.progress.get(job["id"]).record_checkpoint(row["checkpoint_id"], row["step"])

    def _ended(self, job: dict[str, Any], header: dict[str, Any]) -> None:
        job_id = job["id"]
        self._loops.pop(job_id, None)
        record = self.progress.get(job_id)
        status = header.get("status")
        if status == "failed":
            record.set_phase(states.PHASE_FAILED)
            self.progress.changed(job_id, persist=True)
            self.jobs.end(
                job_id, states.JOB_FAILED, header.get("code") or "training_loop_failed", header.get("message")
            )
            return
        if status == "finished" and self.keep_alive_s(job) > 0 and not self.jobs.is_completing(job_id):
            record.set_phase(states.PHASE_KEEP_ALIVE)
            self.progress.changed(job_id, persist=True)
            self.store.touch_job(job_id)
            return
        record.set_phase(states.PHASE_FINISHED if status == "finished" else states.PHASE_STOPPED)
        self.progress.changed(job_id, persist=True)
        # The loop's request finishes right after this message: the job ends then, freeing its device.
        self.jobs.finish_when_drained(job_id, self.requests.has_active)
