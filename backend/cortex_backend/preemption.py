"""Preemption (`--preempt-below N`, off by default): a waiting job may take the device of a managed training
run of a lower priority, when that run's priority is below N. The run is never killed without a save: it
is told to stop after the step in hand and save a resumable checkpoint (the path a draining backend takes,
drain.py), then its worker is stopped, the waiting job gets the device, and the run is queued again at its
own priority and resumes from that checkpoint (resume.py), losing no step.

Only the first job in line that does not fit is looked at, and only training runs whose loop trains now can
be paused (a job driven by its client has no loop that could save for it). Runs are chosen lowest priority
first, then the most recently started, and only as many as free enough slots on the devices the waiting
job can use. One preemption is in flight at a time: the next waits until its device is free. Each is
recorded in the run's progress record (`preemptions`: when, at which step and checkpoint, for which band)
and in its log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.priority import DEFAULT_PRIORITY

from .data_plane import RequestManager
from .devices import Device
from .executors.base import Executor
from .jobs import JobManager
from .progress import ProgressBook
from .resume import Resumer
from .scheduler import Scheduler
from .store import Store
from .training_loops import TrainingLoops

log = logging.getLogger("cortex_backend.preemption")

# The loop's request ends right after its `ended` message; how long to let that answer land before
# the worker is stopped (a request still open then is ended by the service).
REQUEST_GRACE_S = 10.0
POLL_S = 0.05


class Preemption:
    def __init__(
        self,
        below: int | None,
        store: Store,
        scheduler: Scheduler,
        executor: Executor,
        jobs: JobManager,
        requests: RequestManager,
        training_loops: TrainingLoops,
        progress: ProgressBook,
        resumer: Resumer,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.below = below
        self.store = store
        self.scheduler = scheduler
        self.executor = executor
        self.jobs = jobs
        self.requests = requests
        self.training_loops = training_loops
        self.progress = progress
        self.resumer = resumer
        self.log_line = log_line
        # job id -> the band it was told to pause for, until its loop pauses (or ends by itself)
        self._pausing: dict[str, int] = {}
        # runs that paused and whose device is being freed before they are queued again
        self._requeueing: set[str] = set()
        if below is None:
            return
        scheduler.on_blocked = self.consider
        training_loops.on_paused.append(self.paused)
        # A run whose loop starts now may be what a job blocked earlier needs to preempt.
        jobs.on_job_running.append(lambda job_id: self._look_again())
        jobs.on_job_ended.append(self._forget)

    # choosing ------------------------------------------------------------------------------------
    def consider(self, holder_id: str) -> None:
        """The first holder in line does not fit: pause enough lower-priority training runs to make room."""
        # A loop told to pause may have ended by itself first (its last step, or a failure): forget it.
        for job_id in [job_id for job_id in self._pausing if job_id not in self.training_loops.running()]:
            del self._pausing[job_id]
        if self._pausing or self._requeueing:
            return
        if self.scheduler.room_waits.holds(holder_id):  # it waits for adapter-host memory, not a device slot
            return
        asked = self.scheduler.priority_of(holder_id)
        request = self.scheduler.request_of(holder_id)
        if asked is None or request is None:
            return
        band = asked[0]
        slots, min_memory, exclusive = request
        eligible = self.scheduler.eligible_devices(min_memory, exclusive, self.scheduler.models_of(holder_id))
        # Slots of jobs that ended and whose workers are stopping are free in a moment: never preempt for them.
        freeing = [
            holder for holder in self.scheduler.holders_on(eligible) if self.scheduler.is_freeing(holder)
        ]
        if not eligible or self.scheduler.would_fit(holder_id, freeing):
            return
        chosen: list[str] = []
        for job_id in self._candidates(band, eligible):
            chosen.append(job_id)
            if self.scheduler.would_fit(holder_id, freeing + chosen):
                for victim in chosen:
                    self._pause(victim, band)
                return

    def _candidates(self, band: int, eligible: list[Device]) -> list[str]:
        """Training runs training now on `eligible` devices that may give way to `band`: lowest first."""
        ranked = []
        for job_id in self.training_loops.running():
            job = self.store.get_job(job_id)
            if job is None or job["status"] != states.JOB_RUNNING:
                continue
            priority = job["spec"].get("priority", DEFAULT_PRIORITY)
            if priority >= self.below or priority >= band:
                continue
            if not self.scheduler.slots_held(job_id, eligible):
                continue
            ranked.append((priority, -(job["started_at"] or 0.0), job_id))
        return [job_id for *_, job_id in sorted(ranked)]

    def _look_again(self) -> None:
        pending = self.scheduler.pending_holders()
        if pending:
            self.consider(pending[0])

    def _forget(self, job_id: str, *_: Any) -> None:
        self._pausing.pop(job_id, None)
        self._requeueing.discard(job_id)

    # pausing -------------------------------------------------------------------------------------
    def _pause(self, job_id: str, band: int) -> None:
        job = self.store.get_job(job_id)
        trainer = next(sub for sub in job["sub_jobs"] if sub["type"] == states.TRAINING)
        self._pausing[job_id] = band
        self.executor.drain(job_id, trainer["id"])
        self.log_line(
            job_id,
            f"[system] a priority-{band} job waits for this run's device (--preempt-below"
            f" {self.below}): pausing after the step in hand at a resumable checkpoint",
        )
        log.info("preempting training run %s for a priority-%d job", job_id, band)

    def paused(self, job: dict[str, Any], header: dict[str, Any]) -> bool:
        """A loop paused at a checkpoint; True if it paused for a preemption (it is then queued again)."""
        band = self._pausing.pop(job["id"], None)
        if band is None:
            return False
        self._requeueing.add(job["id"])
        note = {
            "at": time.time(),
            "step": int(header.get("step") or 0),
            "checkpoint_id": header.get("checkpoint"),
            "by_priority": band,
        }
        record = self.progress.get(job["id"])
        if record is not None:
            record.preemptions.append(note)
            self.progress.changed(job["id"], persist=True)
        self.log_line(
            job["id"],
            f"[system] preempted by a priority-{band} job: paused at step {note['step']}; checkpoint"
            f" {note['checkpoint_id']} resumes it once a device is free",
        )
        task = asyncio.ensure_future(self._requeue(job["id"], band))
        task.add_done_callback(lambda _: self._requeueing.discard(job["id"]))
        return True

    async def _requeue(self, job_id: str, band: int) -> None:
        """Free the run's device (the waiting job is admitted) and queue the run again."""
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + REQUEST_GRACE_S
            while self.requests.has_active(job_id) and loop.time() < deadline:
                await asyncio.sleep(POLL_S)
            self.requests.fail_active(job_id, "cancelled", "the run was preempted; it resumes by itself")
            await self.jobs.set_aside(job_id)
            queued = self.resumer.requeue_from_checkpoint(
                job_id, "preempted", f"preempted by a priority-{band} job"
            )
            self._requeueing.discard(job_id)  # the next preemption may start
            if queued is not None:
                self.jobs.admit()
                self.jobs.queue_moved()
        except Exception:
            log.exception("queueing preempted run %s again failed", job_id)
            self.jobs.end(job_id, states.JOB_FAILED, "training_loop_failed", "it could not be queued again")
