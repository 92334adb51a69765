"""Freeing a job's device when its work ends, never throwing a trained adapter away.

- `complete` is "Free device" (`POST /v1/jobs/{id}/complete`): a managed loop still training is asked
  to stop after its step in hand (it saves checkpoint `final` itself); a job with trained steps that no
  checkpoint holds gets a `final` save queued first. The job ends `done` once its queued requests ran.
- `sweep` completes, the same way, running jobs that have had nothing to do for their idle timeout
  (the backend's `--idle-timeout`), and training runs whose keep-alive has passed without requests.
- `idle_until` and `keep_alive_until` say when that will happen, for the views.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.checkpoint_format import FINAL_CHECKPOINT, WEIGHTS_ONLY
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .data_plane import RequestManager
from .jobs import JobManager
from .progress import ProgressBook
from .store import Store
from .training_loops import TrainingLoops, loop_spec

log = logging.getLogger("cortex_backend.completion")


class Completion:
    def __init__(
        self,
        store: Store,
        jobs: JobManager,
        requests: RequestManager,
        progress: ProgressBook,
        loops: TrainingLoops,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.requests = requests
        self.progress = progress
        self.loops = loops

    def complete(self, principal: Principal, job_id: str) -> tuple[dict[str, Any], str | None]:
        """Free a job's device; returns the job and the checkpoint saved first (if one was)."""
        job = self.jobs.visible_job(principal, job_id)
        if job["status"] == states.JOB_DONE:
            return job, None
        if job["status"] in states.JOB_TERMINAL:
            raise ApiError("job_finished", f"job {job_id} is already {job['status']}; it cannot be completed")
        saved = self._complete(job)
        return self.store.get_job(job_id), saved

    def _complete(self, job: dict[str, Any]) -> str | None:
        job_id = job["id"]
        if self.jobs.is_completing(job_id):
            return None
        saved = None
        record = self.progress.get(job_id)
        if self.loops.stop(job_id):
            saved = FINAL_CHECKPOINT if record is not None and record.step > 0 else None
        elif job["status"] == states.JOB_RUNNING and self._has_unsaved_steps(job_id, record):
            saved = self._save_final(job)
        self.jobs.finish_when_drained(job_id, self.requests.has_active)
        return saved

    def _has_unsaved_steps(self, job_id: str, record) -> bool:
        if record is not None and record.unsaved_steps:
            return True
        return "step" in self.requests.active_ops(job_id)  # a step still queued: the save goes after it

    def _save_final(self, job: dict[str, Any]) -> str:
        loop = loop_spec(job) or {}
        kind = (loop.get("save") or {}).get("type", WEIGHTS_ONLY)
        name = self.requests.checkpoints.free_name(job["id"], FINAL_CHECKPOINT)
        self.requests.submit_for_service(job, "save", {"checkpoint_id": name, "type": kind})
        log.info("job %s: saving checkpoint %s before freeing its device", job["id"], name)
        return name

    # timers ------------------------------------------------------------------------------------------
    def keep_alive_until(self, job: dict[str, Any]) -> float | None:
        """When a training run sampling after training frees its device, if nothing more is asked of it."""
        record = self.progress.get(job["id"])
        if job["status"] != states.JOB_RUNNING or record is None or record.phase != states.PHASE_KEEP_ALIVE:
            return None
        return job["last_activity_at"] + self.loops.keep_alive_s(job)

    def idle_until(self, job: dict[str, Any]) -> float | None:
        """When a running job with nothing to do is completed (None while it works, or keeps alive)."""
        if (
            job["status"] != states.JOB_RUNNING
            or self.requests.has_active(job["id"])
            or self.jobs.is_completing(job["id"])
        ):
            return None
        record = self.progress.get(job["id"])
        timeout = self.jobs.idle_timeout_s(job)
        if timeout is None or (record is not None and record.phase == states.PHASE_KEEP_ALIVE):
            return None
        return job["last_activity_at"] + timeout

    def sweep(self, now: float | None = None) -> list[str]:
        """Complete the running jobs whose idle timeout or keep-alive has passed; returns their ids."""
        now = now or time.time()
        completed = []
        for job in self.store.jobs_with_status([states.JOB_RUNNING]):
            deadline = self.keep_alive_until(job) or self.idle_until(job)
            if deadline is not None and now >= deadline:
                log.info(
                    "job %s had nothing to do since %.0fs: completing it",
                    job["id"],
                    now - job["last_activity_at"],
                )
                self._complete(job)
                completed.append(job["id"])
        return completed
