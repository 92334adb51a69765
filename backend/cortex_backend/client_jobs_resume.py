"""Jobs driven by their client come back after the backend stops, holding their newest resumable checkpoint.

A primitive job (a client sends its forward_backward and step; no managed loop) with a training sub-job
that was in flight when the backend stopped is queued again if it has a resumable checkpoint. A drained
stop saved one after the job's queued requests ran (`drained`, drain.py), so nothing is lost; after a
crash it is the newest one the client (or parking) saved, and the steps after it are lost, as the note
says. Once its workers are up, its training sub-job loads that checkpoint before any request the client
sends (both wait in the same queue), and the job's log and progress record (`resumed`) say which
checkpoint and step it holds. Its sampling sub-jobs start from their base: the client syncs them again.
Requests in flight at the stop failed `backend_restarted` (retryable) and are sent again by the client; a
stream of numbered requests (the Tinker and Cortex faces) goes on from the first number it sends after the
restart (numbered_submissions.py). A job without a resumable checkpoint fails as before, naming its newest
checkpoint (jobs.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .data_plane import RequestManager
from .jobs import JobManager
from .progress import ProgressBook, ProgressRecord
from .resume import IN_FLIGHT, back_to_queue, newest_resumable, resume_note
from .store import Store

log = logging.getLogger("cortex_backend.client_jobs_resume")

# How long the load of the checkpoint may take, from the job's requeue (queue, worker start, load).
LOAD_TIMEOUT_S = 1800.0
# How many of a job's newest requests are read to count the steps a crash lost.
RECENT_REQUESTS = 10_000


def comes_back(job: dict[str, Any]) -> bool:
    """A job its client drives (no managed loop), with a training sub-job whose state a checkpoint holds."""
    return not job["spec"].get("training_loop") and any(
        sub["type"] == states.TRAINING for sub in job["sub_jobs"]
    )


class ClientJobsResume:
    def __init__(
        self,
        store: Store,
        jobs: JobManager,
        requests: RequestManager,
        progress: ProgressBook,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.requests = requests
        self.progress = progress
        self.log_line = log_line
        # job id -> the checkpoint row it comes back with, and the steps lost since it
        self._to_load: dict[str, tuple[dict[str, Any], int]] = {}
        self._tasks: set[asyncio.Task] = set()

    def requeue_after_restart(self) -> set[str]:
        """Queue again every client-driven job that was in flight and has a resumable checkpoint; their ids.
        Called before the executor starts: the loads are sent by `load_checkpoints`, once it has."""
        for job in self.store.jobs_with_status(IN_FLIGHT):
            if not comes_back(job):
                continue
            checkpoint = newest_resumable(self.store, job["id"])
            if checkpoint is not None:
                self._requeue(job, checkpoint)
        if self._to_load:
            log.info(
                "%d client-driven job(s) come back holding their newest resumable checkpoint: %s",
                len(self._to_load),
                ", ".join(sorted(self._to_load)),
            )
        return set(self._to_load)

    def _requeue(self, job: dict[str, Any], checkpoint: dict[str, Any]) -> None:
        job_id = job["id"]
        stored = self.store.get_progress(job_id) or {}
        step = int(checkpoint["step"])
        lost = max(int(stored.get("step") or 0) - step, self._steps_after(job_id, checkpoint))
        note = resume_note(checkpoint, lost, stored, "backend_restarted")
        record = ProgressRecord.continued({"source": states.PROGRESS_PRIMITIVE, **stored}, step, note)
        self.progress.put(job_id, record)
        back_to_queue(self.store, self.jobs, job, job.get("last_activity_at"))
        self.requests.continue_streams_after_restart(job_id)
        self._to_load[job_id] = (checkpoint, lost)

    def _steps_after(self, job_id: str, checkpoint: dict[str, Any]) -> int:
        """The steps applied after the checkpoint was written: the progress record is written at most once a
        second, so after a crash the requests are the record of what was lost (the worker runs them in order)."""
        rows = self.store.list_requests(job_id, RECENT_REQUESTS)
        return sum(
            1
            for row in rows
            if row["op"] == "step"
            and row["status"] == states.REQUEST_SUCCEEDED
            and (row["finished_at"] or 0) > checkpoint["created_at"]
        )

    def load_checkpoints(self) -> None:
        """Send each requeued job's load: the first request its training sub-job runs once its worker is up."""
        to_load, self._to_load = self._to_load, {}
        for job_id, (checkpoint, lost) in to_load.items():
            job = self.store.get_job(job_id)
            if job is None or job["status"] in states.JOB_TERMINAL:
                continue
            owner = Principal(token_id="restart", owner=job["owner"], scopes=frozenset())
            try:
                request_id = self.requests.submit_for_service(
                    job, "load", {"checkpoint_id": checkpoint["id"]}, principal=owner
                )
            except ApiError as exc:
                self._failed(job_id, checkpoint, exc.message)
                continue
            task = asyncio.ensure_future(self._finish(job_id, checkpoint, lost, request_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _finish(self, job_id: str, checkpoint: dict[str, Any], lost: int, request_id: str) -> None:
        status = await self.requests.final_status(request_id, LOAD_TIMEOUT_S)
        if status != states.REQUEST_SUCCEEDED:
            request = self.store.get_request(request_id) or {}
            self._failed(job_id, checkpoint, request.get("error_message") or f"its load ended {status}")
            return
        job = self.store.get_job(job_id) or {"sub_jobs": []}
        samplers = [sub for sub in job["sub_jobs"] if sub["type"] != states.TRAINING]
        self.log_line(
            job_id,
            f"[system] the backend restarted: this job holds checkpoint {checkpoint['id']} (step"
            f" {checkpoint['step']}) loaded"
            + (f"; {lost} step(s) trained after it were lost" if lost else "; no step was lost")
            + "; requests in flight at the stop failed with backend_restarted and can be sent again"
            + ("; its sampling sub-jobs start from the base until the next weight sync" if samplers else ""),
        )

    def _failed(self, job_id: str, checkpoint: dict[str, Any], why: str) -> None:
        self.jobs.end(
            job_id,
            states.JOB_FAILED,
            "restore_failed",
            f"this job could not come back after the restart with its checkpoint {checkpoint['id']!r} ({why});"
            " create a new job and load that checkpoint",
        )
