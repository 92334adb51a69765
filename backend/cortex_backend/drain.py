"""A stop that keeps work: SIGTERM (and `cortex-nb backend stop`) drains the backend before it exits.

While draining, new jobs and new data-plane requests are refused with `backend_draining` (503, which
clients retry), each managed training loop is told to stop after the step in hand and save a resumable
checkpoint (it resumes from it at the next start, resume.py), and the requests already queued for
primitive jobs run to their end. Then each running job its client drives with a training sub-job saves a
resumable checkpoint (`drained`), from which it comes back at the next start (client_jobs_resume.py).
When nothing is left running, or after the grace period (default 60 s, `--drain-grace`), the backend
exits; whatever still runs then is stopped hard, and is failed at the next start as `backend_restarted`
(a training run resumes from its newest periodic checkpoint instead, and a client-driven job from its
newest resumable one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.checkpoint_format import RESUMABLE
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .client_jobs_resume import comes_back
from .data_plane import RequestManager
from .executors.base import Executor
from .storage_faults import is_storage_error
from .store import Store
from .training_loops import TrainingLoops

log = logging.getLogger("cortex_backend.drain")

# The checkpoint a client-driven job saves before the stop (`drained`, `drained-2`, ...).
DRAINED_CHECKPOINT = "drained"
# How often the drain looks whether work is left.
POLL_S = 0.1


@dataclass
class DrainReport:
    """What a drain did: how long it took, which runs paused cleanly, which jobs it had to cut short."""

    seconds: float = 0.0
    loops_drained: list[str] = field(default_factory=list)
    cut_short: list[str] = field(default_factory=list)


class Drain:
    def __init__(
        self, store: Store, executor: Executor, requests: RequestManager, training_loops: TrainingLoops
    ) -> None:
        self.store = store
        self.executor = executor
        self.requests = requests
        self.training_loops = training_loops
        self.draining = False

    # admission ----------------------------------------------------------------------------------
    def _refusal(self) -> ApiError:
        return ApiError(
            "backend_draining",
            "the backend is stopping and admits no new work; retry in a moment (once it is back, managed"
            " runs resume by themselves)",
        )

    def refuse_new_job(self, principal: Principal, spec: dict[str, Any]) -> dict[str, Any]:
        if self.draining:
            raise self._refusal()
        return spec

    def refuse_request(self, job: dict[str, Any], op: str) -> None:
        if self.draining:
            raise self._refusal()

    # draining -----------------------------------------------------------------------------------
    async def run(self, grace_s: float) -> DrainReport:
        """Stop admitting work, pause managed loops at a checkpoint, let queued requests finish; return
        when nothing runs or `grace_s` has passed."""
        self.draining = True
        started = time.monotonic()
        loops = self.training_loops.running()
        for job_id in loops:
            job = self.store.get_job(job_id)
            trainer = next(
                (sub for sub in (job or {}).get("sub_jobs", []) if sub["type"] == states.TRAINING), None
            )
            if trainer is not None:
                self.executor.drain(job_id, trainer["id"])
        log.info(
            "draining: %d training run(s) pause at their next step; new work is refused (grace %.0fs)",
            len(loops),
            grace_s,
        )
        deadline = started + grace_s
        busy = await self._wait_idle(deadline)
        saved = self._save_client_jobs(busy)
        if saved:
            busy = await self._wait_idle(deadline)
        report = DrainReport(
            seconds=time.monotonic() - started,
            loops_drained=[job_id for job_id in loops if job_id not in busy],
            cut_short=sorted(busy),
        )
        if report.cut_short:
            log.warning(
                "drain grace of %.0fs passed; stopping %d job(s) hard: %s",
                grace_s,
                len(report.cut_short),
                ", ".join(report.cut_short),
            )
        log.info(
            "drained in %.2fs: %d training run(s) paused at a checkpoint",
            report.seconds,
            len(report.loops_drained),
        )
        return report

    async def _wait_idle(self, deadline: float) -> set[str]:
        """Wait until no job has a request queued or running, or `deadline`; the jobs still busy."""
        busy = self._busy()
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            busy = self._busy()
        return busy

    def _save_client_jobs(self, busy: set[str]) -> list[str]:
        """Each running client-driven training job, its requests done, saves a resumable checkpoint to come
        back from; the ids of those saving. (Gradients no step has applied yet are not in it.)"""
        saving = []
        for job in self.store.jobs_with_status([states.JOB_RUNNING]):
            if job["id"] in busy or not comes_back(job):
                continue
            name = self.requests.checkpoints.free_name(job["id"], DRAINED_CHECKPOINT)
            try:
                self.requests.submit_for_service(job, "save", {"checkpoint_id": name, "type": RESUMABLE})
            except ApiError as exc:
                # e.g. the owner's checkpoint quota: it comes back from an older checkpoint, or fails
                log.warning("job %s could not save a checkpoint before the stop: %s", job["id"], exc.message)
                continue
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                # a full disk or a held lock: the stop goes on; the job comes back from an older checkpoint
                log.warning(
                    "job %s could not save a checkpoint before the stop: the store refused (%s)",
                    job["id"],
                    exc,
                )
                continue
            saving.append(job["id"])
        if saving:
            log.info("draining: %d client-driven job(s) save a checkpoint to come back from", len(saving))
        return saving

    def _busy(self) -> set[str]:
        """Running jobs with requests still queued or running (a managed loop is one until it pauses)."""
        running = self.store.jobs_with_status([states.JOB_RUNNING])
        return {job["id"] for job in running if self.requests.has_active(job["id"])}
