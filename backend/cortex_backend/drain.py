"""A stop that keeps work: SIGTERM (and `cortex-nb backend stop`) drains the backend before it exits.

While draining, new jobs and new data-plane requests are refused with `backend_draining` (503, which
clients retry), each managed training loop is told to stop after the step in hand and save a resumable
checkpoint (it resumes from it at the next start, resume.py), and the requests already queued for
primitive jobs run to their end. When nothing is left running, or after the grace period (default 60 s,
`--drain-grace`), the backend exits; whatever still runs then is stopped hard, and is failed at the next
start as `backend_restarted` (a training run resumes from its newest periodic checkpoint instead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .data_plane import RequestManager
from .executors.base import Executor
from .store import Store
from .training_loops import TrainingLoops

log = logging.getLogger("cortex_backend.drain")

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
        busy = self._busy()
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            busy = self._busy()
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

    def _busy(self) -> set[str]:
        """Running jobs with requests still queued or running (a managed loop is one until it pauses)."""
        running = self.store.jobs_with_status([states.JOB_RUNNING])
        return {job["id"] for job in running if self.requests.has_active(job["id"])}
