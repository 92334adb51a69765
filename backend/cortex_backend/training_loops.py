"""Training runs, the service's side: a job created with a `training_loop` trains by itself.

At creation the loop spec was checked by its schema (`TrainingLoop`, in the body of `POST /v1/jobs`); here
its datasets must be the owner's, its prompts fit the model and its `init_from` checkpoint be visible. Once the job runs, the loop is queued on its training sub-job as one
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
from cortex_nb.protocol.checkpoint_format import AUTO_CHECKPOINT_PREFIX, FINAL_CHECKPOINT
from cortex_nb.protocol.errors import ApiError

from .auth import ADMIN, Principal
from .checkpoints import CheckpointManager
from .data_plane import RequestManager
from .datasets import DatasetStore
from .jobs import JobManager
from .models import ModelCatalog
from .progress import ProgressBook, ProgressRecord
from .stats import job_device_seconds
from .store import Store
from .validation import validate_prompts

log = logging.getLogger("cortex_backend.training_loops")
# The service acting on its own (pruning automatic checkpoints), never a client's token.
THE_SERVICE = Principal("service", "service", frozenset({ADMIN}))


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
        # job id -> where its loop resumes after a backend restart (resume.py fills it at start)
        self.resume_from: dict[str, dict[str, Any]] = {}
        # Called with (job, the loop's `ended` header) when a loop paused at a checkpoint (status `drained`);
        # one that returns True has asked for that pause itself (a preemption, preemption.py).
        self.on_paused: list[Callable[[dict[str, Any], dict[str, Any]], bool]] = []
        jobs.validators.append(self.validate)
        requests.admission_checks.append(self.refuse_racing_load)
        jobs.on_job_running.append(self.start)
        jobs.on_job_ended.append(lambda job_id, *_: self._loops.pop(job_id, None))

    # creation --------------------------------------------------------------------------------------
    def validate(self, principal: Principal, spec: dict[str, Any]) -> dict[str, Any]:
        """Check what a job's `training_loop` (if any, normalised) names against this backend."""
        loop = spec.get("training_loop")
        if loop is None:
            return spec
        trainers = [sub for sub in spec["sub_jobs"] if sub["type"] == states.TRAINING]
        if len(spec["sub_jobs"]) != 1 or len(trainers) != 1:
            raise ApiError(
                "invalid_field",
                "training_loop: a training run has exactly one sub-job, of type"
                " training; create samplers as jobs of their own",
                {"field": "sub_jobs"},
            )
        self.datasets.get(principal, loop["data"]["dataset_id"])
        if "eval" in loop:
            self.datasets.get(principal, loop["eval"]["dataset_id"])
        if "sample" in loop:
            info = self.catalog.get(trainers[0]["base_model"])
            limit = int(trainers[0].get("max_seq_len") or info.max_positions or 2048)
            sample = loop["sample"]
            try:
                validate_prompts(sample["prompts"], self.catalog, info, sample["max_tokens"], limit)
            except ApiError as exc:
                field = "training_loop.sample." + str(exc.detail.get("field", "prompts"))
                raise ApiError(exc.code, f"training_loop.sample.{exc.message}", {"field": field}) from None
        if "init_from" in loop:
            self._init_checkpoint(principal, loop["init_from"]["job"], loop["init_from"]["checkpoint"])
        return spec

    def _init_checkpoint(self, principal: Principal, job_id: str, checkpoint_id: str) -> dict[str, Any]:
        """The checkpoint `init_from` names, if this principal may read it (404 naming the field if not)."""
        source = self.store.get_job(job_id)
        try:
            if source is None:
                raise ApiError("checkpoint_not_found", f"no job {job_id!r} is visible to this token")
            return self.checkpoints.find(principal, source["owner"], job_id, checkpoint_id)
        except ApiError as exc:
            raise ApiError(
                exc.code, f"training_loop.init_from: {exc.message}", {"field": "training_loop.init_from"}
            ) from None

    def refuse_racing_load(self, job: dict[str, Any], op: str) -> None:
        """A `load` into a training run while its loop trains would change the weights under it."""
        if op == "load" and job["id"] in self._loops:
            raise ApiError(
                "managed_run_busy",
                f"job {job['id']} is a training run and its loop is training; a load would"
                " race it. Start a new run with `init_from: {job, checkpoint}` instead, or load"
                " once this one has ended (keep_alive keeps it up for that)",
                {"job_id": job["id"]},
            )

    def forget(self, job_id: str) -> None:
        """The job's loop is gone without ending the job (its worker died and it is retried)."""
        self._loops.pop(job_id, None)

    def running(self) -> dict[str, str]:
        """job id -> its training loop's request id, for the loops that train now."""
        return dict(self._loops)

    # running ---------------------------------------------------------------------------------------
    def start(self, job_id: str) -> None:
        """The job's workers are up: queue its loop on the trainer."""
        job = self.store.get_job(job_id)
        loop = loop_spec(job) if job is not None else None
        if loop is None:
            return
        train = self.datasets.read(job["owner"], loop["data"]["dataset_id"])
        held_out = self.datasets.read(job["owner"], loop["eval"]["dataset_id"]) if "eval" in loop else b""
        record = self.progress.start(job_id, states.PROGRESS_MANAGED)
        record.set_phase(states.PHASE_TRAINING)
        self.progress.changed(job_id, persist=True)
        params = {
            "spec": loop,
            "data_bytes": len(train),
            "checkpoint_dir": str(self.checkpoints.job_dir(job["owner"], job_id)),
        }
        resume = self.resume_from.pop(job_id, None)
        if resume is not None:
            params["resume_from"] = resume
        elif "init_from" in loop:
            params["init_from"] = self._init_params(job, loop["init_from"])
            if params["init_from"] is None:
                return
        self._loops[job_id] = self.requests.submit_for_service(job, "train_loop", params, train + held_out)

    def _init_params(self, job: dict[str, Any], init: dict[str, Any]) -> dict[str, Any] | None:
        """What the worker loads for `init_from`; None (the job failed) if the checkpoint is gone."""
        row = self.store.get_checkpoint(init["job"], init["checkpoint"])
        if row is None:
            self.jobs.end(
                job["id"],
                states.JOB_FAILED,
                "checkpoint_not_found",
                f"training_loop.init_from: checkpoint {init['checkpoint']!r} of job {init['job']} was deleted"
                " before this run started",
            )
            return None
        return {
            "directory": str(self.checkpoints.path(row)),
            "manifest": row["manifest"],
            "checkpoint_id": row["id"],
            "source_job_id": init["job"],
            "restore_optimizer": init["optimizer"],
        }

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
            record.budget_device_s = (loop_spec(job) or {}).get("budget_device_s")
            persist = True
        elif event == "step":
            record.record_forward_backward(
                header["loss"], header["weights"], header["tokens"], header.get("at")
            )
            record.record_step(header["step"], header.get("at"))
            self._spend_budget(job, record, int(header["step"]))
        elif event == "eval":
            record.record_eval(header["step"], header["loss"], header["weights"])
        elif event == "samples":
            record.record_samples(header["step"], header["items"])
        elif event == "checkpoint":
            self._adopt_checkpoint(job, sub_job_id, header)
            persist = True
        elif event == "resumed":
            self.log_line(
                job_id,
                f"[system] resumed from checkpoint {header['checkpoint_id']} at step {header['step']}",
            )
        elif event == "ended":
            self._ended(job, header)
            return
        self.progress.changed(job_id, persist=persist)

    def _spend_budget(self, job: dict[str, Any], record: ProgressRecord, step: int) -> None:
        """At each step of a run with a budget: once the job's device-seconds reach it, stop the loop after
        the step in hand, saving `final` (the same path as Stop and save)."""
        budget = (loop_spec(job) or {}).get("budget_device_s")
        if not budget:
            return
        used = job_device_seconds(job)
        before, record.device_seconds_at_step = record.device_seconds_at_step, used
        record.budget_device_s = float(budget)
        if used < budget or record.budget_stop is not None:
            return
        record.budget_stop = {"step": step, "device_seconds": round(used, 3), "before": before}
        self.log_line(
            job["id"],
            f"[system] budget spent: {used:.1f} of {budget:g} device-seconds at step {step};"
            f" stopping after this step and saving checkpoint '{FINAL_CHECKPOINT}'",
        )
        self.stop(job["id"])

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
        if row["checkpoint_id"].startswith(AUTO_CHECKPOINT_PREFIX):
            self._forget_older_auto_saves(job, row["checkpoint_id"])

    def _forget_older_auto_saves(self, job: dict[str, Any], newest: str) -> None:
        """Automatic checkpoints exist to resume after a crash: only the newest is worth its bytes."""
        for row in self.store.list_checkpoints(job["id"]):
            if row["id"] != newest and row["id"].startswith(AUTO_CHECKPOINT_PREFIX):
                try:
                    self.checkpoints.delete(THE_SERVICE, job, row["id"])
                except ApiError as exc:  # being read (an export): it goes at the next save
                    log.info("kept checkpoint %s of %s: %s", row["id"], job["id"], exc.message)

    def _ended(self, job: dict[str, Any], header: dict[str, Any]) -> None:
        job_id = job["id"]
        self._loops.pop(job_id, None)
        record = self.progress.get(job_id)
        status = header.get("status")
        if status == "drained":
            self.progress.changed(job_id, persist=True)
            if any(handler(job, header) for handler in self.on_paused):
                return
            # The backend is stopping: the job stays as it is in the store, and the next start resumes it.
            self.log_line(
                job_id,
                f"[system] the backend is stopping: paused at step {header.get('step')}; checkpoint"
                f" {header.get('checkpoint')} resumes it when the backend starts again",
            )
            return
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
