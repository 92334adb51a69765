"""Training runs come back after the backend stops: at start, each run that was training or queued is
queued again and its loop resumes from the run's newest resumable checkpoint.

A drained stop (drain.py) saved one at the step in hand, so nothing is lost; after a crash the newest
is a periodic one (`save.every`, or the automatic one every few minutes), and the steps trained after
it are lost and trained again. Either way the run keeps its id, logs and progress record (cut at the
checkpoint's step), and the record's `resumed` note and a log line say where it resumed and how many
steps were lost. A spec with `resume: never` is failed as `backend_restarted` (futures of its requests
then raise that retryable code). Jobs driven by their client come back too, holding their newest
resumable checkpoint (client_jobs_resume.py, which shares `resume_note` and `back_to_queue`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.checkpoint_format import RESUMABLE

from .checkpoints import CheckpointManager
from .jobs import JobManager
from .progress import ProgressBook, ProgressRecord
from .stats import span_closed
from .store import Store
from .training_loops import TrainingLoops

log = logging.getLogger("cortex_backend.resume")

IN_FLIGHT = (states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING)


def resumes(job: dict[str, Any], stored_progress: dict[str, Any] | None) -> bool:
    """Does this job come back after a restart: a training run, not told `resume: never`, still training."""
    loop = job["spec"].get("training_loop")
    if not loop or loop.get("resume", "auto") != "auto":
        return False
    phase = (stored_progress or {}).get("phase")
    return phase not in (states.PHASE_KEEP_ALIVE, states.PHASE_FINISHED)


def newest_resumable(store: Store, job_id: str) -> dict[str, Any] | None:
    rows = [row for row in store.list_checkpoints(job_id) if row["type"] == RESUMABLE]
    return max(rows, key=lambda row: (row["step"], row["created_at"]), default=None)


# The loop logs each step as `[engine] step=N ...`: after a crash, the newest such line is the last step
# trained (the progress record is written at most once a second, so it may be a step or two behind).
STEP_LINE = re.compile(r"^\[engine\] step=(\d+) ")
TAIL_LINES = 400


def last_logged_step(store: Store, job_id: str) -> int:
    for line in reversed(store.last_log_lines(job_id, TAIL_LINES)):
        match = STEP_LINE.match(line)
        if match:
            return int(match.group(1))
    return 0


def resume_note(
    checkpoint: dict[str, Any] | None, lost: int, stored: dict[str, Any], reason: str
) -> dict[str, Any]:
    """The progress record's `resumed` note: where the job came back from, what was lost, how often."""
    previous = stored.get("resumed") or {}
    return {
        "checkpoint_id": checkpoint["id"] if checkpoint else None,
        "step": int(checkpoint["step"]) if checkpoint else 0,
        "lost_steps": lost,
        "restarts": int(previous.get("restarts") or 0) + 1,
        "at": time.time(),
        "reason": reason,
    }


def back_to_queue(store: Store, jobs: JobManager, job: dict[str, Any], span_end: float | None) -> None:
    """Put a stored job and its sub-jobs back to `pending` in the queue, its last failure cleared and its
    device span closed at `span_end`."""
    for sub in job["sub_jobs"]:
        store.update_sub_job(
            job["id"],
            sub["id"],
            status=states.JOB_PENDING,
            device=None,
            failure_code=None,
            failure_message=None,
        )
    store.update_job(
        job["id"],
        status=states.JOB_PENDING,
        failure_code=None,
        failure_message=None,
        **span_closed(job, span_end),
    )
    jobs.requeue(job)


class Resumer:
    def __init__(
        self,
        store: Store,
        jobs: JobManager,
        checkpoints: CheckpointManager,
        progress: ProgressBook,
        training_loops: TrainingLoops,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.checkpoints = checkpoints
        self.progress = progress
        self.training_loops = training_loops
        self.log_line = log_line

    def resume_after_restart(self) -> set[str]:
        """Queue again every training run that was in flight; the ids of those queued."""
        resumed: set[str] = set()
        for job in self.store.jobs_with_status(IN_FLIGHT):
            stored = self.store.get_progress(job["id"])
            if resumes(job, stored):
                self._resume(job, stored or {})
                resumed.add(job["id"])
        if resumed:
            log.info(
                "resuming %d training run(s) after the restart: %s", len(resumed), ", ".join(sorted(resumed))
            )
        return resumed

    def requeue_from_checkpoint(self, job_id: str, reason: str, why: str) -> dict[str, Any] | None:
        """Queue a live training run again from its newest resumable checkpoint (after a failed attempt its
        retry policy covers, or a preemption); its resume note, or None if the job is gone or ended. `why`
        opens the log line that says so."""
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return None
        record = self.progress.get(job_id)
        stored = record.to_json() if record is not None else self.store.get_progress(job_id) or {}
        return self._resume(job, stored, reason, why)

    def _resume(
        self,
        job: dict[str, Any],
        stored: dict[str, Any],
        reason: str = "backend_restarted",
        why: str = "the backend restarted",
    ) -> dict[str, Any]:
        job_id = job["id"]
        checkpoint = newest_resumable(self.store, job_id)
        step = int(checkpoint["step"]) if checkpoint else 0
        was_at = max(int(stored.get("step") or 0), last_logged_step(self.store, job_id))
        lost = max(was_at - step, 0)
        note = resume_note(checkpoint, lost, stored, reason)
        if checkpoint is not None:
            self.training_loops.resume_from[job_id] = {
                "directory": str(self.checkpoints.path(checkpoint)),
                "manifest": checkpoint["manifest"],
                "checkpoint_id": checkpoint["id"],
            }
        else:
            self.training_loops.resume_from.pop(job_id, None)
        if stored:
            self.progress.put(job_id, ProgressRecord.continued(stored, step, note))
        # A retried run's pending state named its failed attempt; queued again, that is history.
        # A live requeue (a retry, a preemption) closes the span now; one after a restart when the backend
        # was last heard of in it.
        end = time.time() if reason != "backend_restarted" else job.get("last_activity_at")
        back_to_queue(self.store, self.jobs, job, end)
        where = (
            f"checkpoint {checkpoint['id']} (step {step})"
            if checkpoint
            else "step 0 (no resumable checkpoint)"
        )
        lost_text = (
            f"{lost} step(s) trained after it were lost (steps {step + 1}-{was_at}) and are trained again"
            if lost
            else "no step was lost"
        )
        self.log_line(job_id, f"[system] {why}: this run resumes from {where}; {lost_text}")
        return note
