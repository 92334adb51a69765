"""What a client sees of a job: its record, plus what the service knows about it right now: the
progress record, why it waits (`queue`), when it frees its device (`idle`, `keep_alive_until`).

Handlers render every job through `JobViews.render`, so `GET /v1/jobs/{id}`, each row of
`GET /v1/jobs` and the long-poll answer carry the same fields.
"""

from __future__ import annotations

import time
from typing import Any

from cortex_nb.protocol import states

from .auth import Principal
from .completion import Completion
from .jobs import JobManager, public_job, queue_key
from .progress import ProgressBook, progress_key
from .queue_reasons import QueueReasons
from .scheduler import Scheduler
from .stats import job_device_seconds
from .store import Store


class JobViews:
    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        jobs: JobManager,
        progress: ProgressBook,
        completion: Completion,
    ) -> None:
        self.jobs = jobs
        self.progress = progress
        self.completion = completion
        self.queue = QueueReasons(store, scheduler, self.frees_in)

    def render(self, job: dict[str, Any], principal: Principal | None = None) -> dict[str, Any]:
        view = public_job(job)
        view["training_loop"] = job["spec"].get("training_loop")
        view["progress"] = self.progress.public(job["id"])
        view["queue"] = (
            self.queue.for_job(job["id"], principal) if job["status"] == states.JOB_PENDING else None
        )
        idle_until = self.completion.idle_until(job)
        view["idle"] = (
            {"timeout_s": self.jobs.idle_timeout_s(job), "frees_at": idle_until} if idle_until else None
        )
        view["keep_alive_until"] = self.completion.keep_alive_until(job)
        view["device_seconds"] = round(job_device_seconds(job), 3)
        return view

    async def wait(
        self,
        principal: Principal,
        job_id: str,
        while_status: str | None,
        after_progress: float | None,
        wait_s: float,
    ) -> dict[str, Any]:
        """The job now, or after waiting up to `wait_s` for its status to leave `while_status` or, with
        `after_progress`, for its progress record to be newer than that (or its queue to move)."""
        if after_progress is None:
            return await self.jobs.wait_for_change(principal, job_id, while_status, wait_s)
        job = self.jobs.visible_job(principal, job_id)
        progress = self.progress.public(job_id) or {}
        if progress.get("updated_at", 0.0) > after_progress or job["status"] in states.JOB_TERMINAL:
            return job
        return await self.jobs.wait_for_change(
            principal, job_id, while_status, wait_s, also_wake_on=(progress_key(job_id), queue_key(job_id))
        )

    def frees_in(self, holder_id: str) -> float | None:
        """Seconds until a job holding slots frees them, where the backend can tell."""
        job = self.jobs.store.get_job(holder_id)
        if job is None or job["status"] != states.JOB_RUNNING:
            return None
        now = time.time()
        until = self.completion.keep_alive_until(job) or self.completion.idle_until(job)
        if until is not None:
            return until - now
        record = self.progress.get(holder_id)
        if record is None or record.source != states.PROGRESS_MANAGED:
            return None
        if record.phase in (states.PHASE_FINISHED, states.PHASE_STOPPED, states.PHASE_FAILED):
            return 0.0  # its training ended: the job is completing and frees its slots now
        if record.phase == states.PHASE_TRAINING:
            eta = record.eta_s()
            keep_alive = self.completion.loops.keep_alive_s(job)
            return None if eta is None else eta + keep_alive
        return None
