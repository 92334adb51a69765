"""A training run's retry policy (`retry: {max, on, backoff_s}` in its training loop): a failed attempt the
policy covers does not end the run. Its unfinished requests fail, its worker is stopped and its device
freed, and after the backoff it is queued again (its own priority and place) and resumes from its newest
resumable checkpoint, as after a backend restart (resume.py).

Each attempt is recorded with the fields of a source run's attempts (runs/retries.py) plus the step it
reached, in the run's progress record (`attempts`), its log, and the event feed (the job goes `pending`
with the attempt's failure code, cleared when it is queued again). A policy can name `worker_crashed` (the
worker died), `host_lost` (its cluster host left) and `oom` (`out_of_memory`); any other failure (bad
data, a refused checkpoint) ends the run: the same attempt would fail the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states

from .data_plane import RequestManager
from .jobs import JobManager
from .progress import ProgressBook
from .resume import Resumer
from .runs.retries import should_retry
from .stats import span_closed
from .store import Store
from .training_loops import TrainingLoops, loop_spec

log = logging.getLogger("cortex_backend.managed_retries")

# failure code -> what a retry policy calls it
RETRY_REASONS = {"worker_crashed": "worker_crashed", "host_lost": "host_lost", "out_of_memory": "oom"}


def attempt_note(
    number: int, code: str | None, message: str | None, started_at: float | None, step: int
) -> dict[str, Any]:
    return {
        "attempt": number,
        "status": states.JOB_FAILED,
        "failure_code": code,
        "failure_message": message,
        "retry_reason": RETRY_REASONS.get(code or ""),
        "started_at": started_at,
        "finished_at": time.time(),
        "step": step,
    }


class ManagedRetries:
    def __init__(
        self,
        store: Store,
        jobs: JobManager,
        requests: RequestManager,
        training_loops: TrainingLoops,
        progress: ProgressBook,
        resumer: Resumer,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.requests = requests
        self.training_loops = training_loops
        self.progress = progress
        self.resumer = resumer
        self.log_line = log_line
        # job id -> the task that frees its device, waits out the backoff and queues it again
        self._waiting: dict[str, asyncio.Task] = {}
        jobs.failure_handlers.append(self.take_failure)
        jobs.on_job_ended.append(self._ended)

    def take_failure(self, job_id: str, code: str | None, message: str | None) -> bool:
        """Record the failed attempt of a training run with a retry policy; True when the policy retries it
        (the job then does not end)."""
        job = self.store.get_job(job_id)
        loop = loop_spec(job) if job is not None else None
        if loop is None or not loop.get("retry") or job_id in self._waiting:
            return False
        # A worker that died before its loop started (while loading the model) has no record yet.
        record = self.progress.start(job_id, states.PROGRESS_MANAGED)
        number = len(record.attempts) + 1
        note = attempt_note(number, code, message, job["started_at"], record.step)
        record.attempts.append(note)
        self.progress.changed(job_id, persist=True)
        reason = note["retry_reason"]
        if not should_retry(loop, number, reason):
            if reason is not None and number > loop["retry"]["max"]:
                self.log_line(
                    job_id, f"[system] attempt {number} failed ({reason}: {code}); no retry is left"
                )
            return False
        policy = loop["retry"]
        text = (
            f"attempt {number} failed ({reason}: {code}): {message}; retrying in {policy['backoff_s']:g} s"
            f" (attempt {number + 1} of at most {policy['max'] + 1})"
        )
        self.requests.fail_active(job_id, code or "worker_crashed", f"attempt {number} failed: {message}")
        self.training_loops.forget(job_id)
        record.set_phase(states.PHASE_WAITING)
        self.progress.changed(job_id, persist=True)
        self.store.update_job(
            job_id,
            status=states.JOB_PENDING,
            failure_code=code,
            failure_message=text,
            **span_closed(self.store.get_job(job_id) or {}),
        )
        self.jobs.waiters.notify(job_id)
        self.log_line(job_id, f"[system] {text}")
        task = asyncio.ensure_future(self._retry(job_id, number + 1, float(policy["backoff_s"])))
        self._waiting[job_id] = task
        task.add_done_callback(lambda _: self._waiting.pop(job_id, None))
        return True

    async def _retry(self, job_id: str, number: int, backoff_s: float) -> None:
        try:
            await self.jobs.set_aside(job_id)
            await asyncio.sleep(backoff_s)
            if self.resumer.requeue_from_checkpoint(job_id, "retry", f"attempt {number}") is not None:
                self.jobs.admit()
                self.jobs.queue_moved()
        except Exception:
            log.exception("retrying training run %s failed", job_id)
            self.jobs.end(job_id, states.JOB_FAILED, "training_loop_failed", "its retry could not be queued")

    def _ended(self, job_id: str, *_: Any) -> None:
        """Cancelled while waiting out its backoff: it is not queued again."""
        task = self._waiting.pop(job_id, None)
        if task is not None and not task.done():
            task.cancel()
