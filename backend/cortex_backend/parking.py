"""Devices are held by work, not by clients: an idle Tinker training client is parked (`--park-idle-s`).

A training client (a primitive job with one training sub-job, driven by forward_backward and optim_step)
that has had nothing to do for `idle_s` seconds, and holds no gradients a step has yet to apply, is
parked: a resumable checkpoint `parked` saves its adapter, optimizer moments, step (its weight version)
and RNG state, its worker is stopped and its device slot freed (the job waits as `pending`, outside the
queue). Its request numbering lives in the service, so it is kept as is. The next request for it queues
the job for a slot again; the new worker loads `parked` first (the checkpoint is then deleted) and runs
the held requests after it, so the numbers a client sees are those it would have seen unparked. The job's
training sub-job `info.parking` says whether it is parked, how often it was, and how long the last
restore took; its log says the same in lines of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.checkpoint_format import RESUMABLE
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .checkpoints import CheckpointManager
from .data_plane import RequestManager
from .jobs import JobManager
from .stats import span_closed
from .store import Store

log = logging.getLogger("cortex_backend.parking")

PARKED_CHECKPOINT = "parked"
# How often idle clients are looked for (parking happens within this of `idle_s`).
SWEEP_S = 0.5
# A park's save or a restore's load that takes longer than this has failed.
OPERATION_TIMEOUT_S = 600.0
# A client whose parking save was refused or failed stays on its device this long before parking is tried again.
FAILED_SAVE_BACKOFF_S = 60.0
# Operations after which the trainer holds gradients no step has applied yet (parking would lose them).
ACCUMULATES = frozenset({"forward_backward"})
CLEARS = frozenset({"step", "load"})


def parkable(job: dict[str, Any]) -> bool:
    """A Tinker training client: one training sub-job, driven by its client (no managed loop)."""
    spec = job["spec"]
    subs = job["sub_jobs"]
    return (
        (spec.get("labels") or {}).get("api") == "tinker"
        and not spec.get("training_loop")
        and len(subs) == 1
        and subs[0]["type"] == states.TRAINING
    )


@dataclass
class Held:
    """A request that arrived while its job had no worker, waiting to be sent in arrival order."""

    sub_job_id: str
    request_id: str
    op: str
    params: dict[str, Any]
    blob: bytes


@dataclass
class ParkedJob:
    """One training client's parking: where it is (`saving`, `stopping`, `parked`, `restoring`)."""

    phase: str
    checkpoint_id: str = ""
    parked_at: float = 0.0
    restore_request: str | None = None
    restore_started: float = 0.0
    held: list[Held] = field(default_factory=list)


class Parking:
    def __init__(
        self,
        idle_s: float | None,
        store: Store,
        jobs: JobManager,
        requests: RequestManager,
        checkpoints: CheckpointManager,
        log_line: Callable[[str, str], None],
    ) -> None:
        self.idle_s = idle_s
        self.store = store
        self.jobs = jobs
        self.requests = requests
        self.checkpoints = checkpoints
        self.log_line = log_line
        self._parking: dict[str, ParkedJob] = {}
        self._busy_at: dict[str, float] = {}  # job id -> when it last had a request in flight
        self._dirty: set[str] = set()  # jobs holding gradients no step has applied
        self._counts: dict[str, dict[str, Any]] = {}  # job id -> parks, last restore seconds
        self._tasks: set[asyncio.Task] = set()
        self._own_requests: set[str] = set()  # the saves and loads of parks and restores in flight
        if idle_s is None:
            return
        requests.dispatch_holds.append(self._hold)
        requests.on_succeeded.append(self._succeeded)
        jobs.on_job_ended.append(self._forget)

    @property
    def enabled(self) -> bool:
        return self.idle_s is not None

    def owns(self, request_id: str) -> bool:
        """Whether a request is a park's save or a restore's load (the client's progress record skips them)."""
        return request_id in self._own_requests

    def phase(self, job_id: str) -> str | None:
        """`saving`, `stopping`, `parked` or `restoring` while a job is (being) parked; None otherwise."""
        parked = self._parking.get(job_id)
        return parked.phase if parked is not None else None

    # finding idle clients -------------------------------------------------------------------------
    async def run(self) -> None:
        """Park idle training clients, forever (a task of the service)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.sweep()
            except Exception:
                log.exception("parking sweep failed")

    def sweep(self, now: float | None = None) -> list[str]:
        """Park every running training client idle for `idle_s`; the ids of those being parked."""
        if self.idle_s is None:
            return []
        now = time.time() if now is None else now
        parked = []
        for job in self.store.jobs_with_status([states.JOB_RUNNING]):
            job_id = job["id"]
            if job_id in self._parking or not parkable(job):
                continue
            if self.requests.has_active(job_id) or self.jobs.is_completing(job_id):
                self._busy_at[job_id] = now
                continue
            idle_since = self._busy_at.setdefault(job_id, now)
            if job_id not in self._dirty and now - idle_since >= self.idle_s:
                self._park(job)
                parked.append(job_id)
        return parked

    def _succeeded(self, request: dict[str, Any], result: dict[str, Any]) -> None:
        if request["op"] in ACCUMULATES:
            self._dirty.add(request["job_id"])
        elif request["op"] in CLEARS:
            self._dirty.discard(request["job_id"])

    # parking --------------------------------------------------------------------------------------
    def _park(self, job: dict[str, Any]) -> None:
        job_id = job["id"]
        name = self.checkpoints.free_name(job_id, PARKED_CHECKPOINT)
        try:
            request_id = self.requests.submit_for_service(
                job, "save", {"checkpoint_id": name, "type": RESUMABLE}
            )
        except ApiError as exc:  # e.g. the owner's checkpoint quota: the client keeps its slot
            log.warning("job %s stays on its device: parking it needs a save (%s)", job_id, exc.message)
            self._busy_at[job_id] = time.time() + FAILED_SAVE_BACKOFF_S
            return
        self._own_requests.add(request_id)
        self._parking[job_id] = ParkedJob("saving", checkpoint_id=name)
        self._spawn(self._finish_parking(job_id, request_id))

    async def _finish_parking(self, job_id: str, save_request: str) -> None:
        parked = self._parking[job_id]
        status = await self._wait_for(save_request)
        self._own_requests.discard(save_request)
        if parked is not self._parking.get(job_id):
            return  # the job ended meanwhile
        if status != states.REQUEST_SUCCEEDED or parked.held:
            # A request came while saving (or the save failed: not tried again for a while): the client
            # stays on its device.
            del self._parking[job_id]
            retry_in = 0.0 if status == states.REQUEST_SUCCEEDED else FAILED_SAVE_BACKOFF_S
            self._busy_at[job_id] = time.time() + retry_in
            self._delete_checkpoint(job_id, parked.checkpoint_id)
            for held in parked.held:
                self._send(job_id, held)
            return
        parked.phase = "stopping"
        await self.jobs.set_aside(job_id)
        if parked is not self._parking.get(job_id):
            return
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        sub = job["sub_jobs"][0]
        parked.phase = "parked"
        parked.parked_at = time.time()
        counts = self._counts.setdefault(job_id, {"parks": 0, "last_restore_s": None})
        counts["parks"] += 1
        with self.store.transaction():
            self.store.update_sub_job(
                job_id,
                sub["id"],
                status=states.JOB_PENDING,
                device=None,
                info={**(sub["info"] or {}), "parking": self._view(job_id)},
            )
            self.store.update_job(
                job_id, status=states.JOB_PENDING, **span_closed(self.store.get_job(job_id) or {})
            )
        self.jobs.waiters.notify(job_id)
        self.log_line(
            job_id,
            f"[system] parked after {self.idle_s:g} s idle: adapter, optimizer, step and RNG saved as"
            f" checkpoint {parked.checkpoint_id}; its device slot is free until its next request",
        )
        log.info("parked idle training client %s", job_id)
        if parked.held:
            self._restore(job_id, parked)

    # holding and restoring ------------------------------------------------------------------------
    def _hold(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> bool:
        """RequestManager's dispatch hold: a request for a job being parked, parked or restoring waits
        here; the first one for a parked job brings it back."""
        parked = self._parking.get(job_id)
        if parked is None or request_id == parked.restore_request:
            return False
        if parked.phase == "restoring" and parked.restore_request is None:
            return False  # the restore's own load, being submitted now (its id is not known yet)
        parked.held.append(Held(sub_job_id, request_id, op, params, blob))
        if parked.phase == "parked":
            self._restore(job_id, parked)
        return True

    def _restore(self, job_id: str, parked: ParkedJob) -> None:
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        parked.phase = "restoring"
        parked.restore_started = time.monotonic()
        owner = Principal(token_id="parking", owner=job["owner"], scopes=frozenset())
        try:
            parked.restore_request = self.requests.submit_for_service(
                job, "load", {"checkpoint_id": parked.checkpoint_id}, principal=owner
            )
        except ApiError as exc:
            self._restore_failed(job_id, exc.message)
            return
        self._own_requests.add(parked.restore_request)
        self.log_line(job_id, "[system] a request came for this parked client: queued for a device slot")
        self.jobs.requeue(job)
        self.jobs.admit()
        self.jobs.queue_moved()
        self._spawn(self._finish_restore(job_id, parked))

    async def _finish_restore(self, job_id: str, parked: ParkedJob) -> None:
        status = await self._wait_for(parked.restore_request or "")
        self._own_requests.discard(parked.restore_request or "")
        if parked is not self._parking.get(job_id):
            return
        if status != states.REQUEST_SUCCEEDED:
            request = self.store.get_request(parked.restore_request or "") or {}
            self._restore_failed(job_id, request.get("error_message") or f"its load ended {status}")
            return
        seconds = time.monotonic() - parked.restore_started
        del self._parking[job_id]
        self._busy_at[job_id] = time.time()
        counts = self._counts.setdefault(job_id, {"parks": 1, "last_restore_s": None})
        counts["last_restore_s"] = round(seconds, 3)
        job = self.store.get_job(job_id)
        if job is not None:
            sub = job["sub_jobs"][0]
            self.store.update_sub_job(
                job_id, sub["id"], info={**(sub["info"] or {}), "parking": self._view(job_id)}
            )
        self.store.add_request_event(
            parked.restore_request or "", "restored_from_parking", {"seconds": seconds}
        )
        self.log_line(
            job_id,
            f"[system] restored from parking in {seconds:.2f} s (queue, worker start and load of checkpoint"
            f" {parked.checkpoint_id}); running the {len(parked.held)} request(s) that waited",
        )
        self._delete_checkpoint(job_id, parked.checkpoint_id)
        for held in parked.held:
            self._send(job_id, held)

    def _restore_failed(self, job_id: str, why: str) -> None:
        self._parking.pop(job_id, None)
        self.jobs.end(
            job_id,
            states.JOB_FAILED,
            "restore_failed",
            f"this parked training client could not be brought back ({why}); create a new training client"
            f" and load its checkpoint {PARKED_CHECKPOINT!r}",
        )

    def _send(self, job_id: str, held: Held) -> None:
        """Send a held request to the job's worker (or its start-up backlog), unless it ended meanwhile."""
        if self.store.request_status(held.request_id) == states.REQUEST_QUEUED:
            self.requests.executor.submit(
                job_id, held.sub_job_id, held.request_id, held.op, held.params, held.blob
            )

    # records --------------------------------------------------------------------------------------
    def _view(self, job_id: str) -> dict[str, Any]:
        parked = self._parking.get(job_id)
        counts = self._counts.get(job_id, {"parks": 0, "last_restore_s": None})
        return {
            "parked": parked is not None and parked.phase == "parked",
            "parked_at": parked.parked_at if parked is not None else None,
            "checkpoint_id": parked.checkpoint_id if parked is not None else None,
            "idle_s": self.idle_s,
            **counts,
        }

    def _delete_checkpoint(self, job_id: str, checkpoint_id: str) -> None:
        job = self.store.get_job(job_id)
        if job is None:
            return
        owner = Principal(token_id="parking", owner=job["owner"], scopes=frozenset())
        with contextlib.suppress(ApiError):
            self.checkpoints.delete(owner, job, checkpoint_id)

    def _forget(self, job_id: str, *_: Any) -> None:
        self._parking.pop(job_id, None)
        self._busy_at.pop(job_id, None)
        self._dirty.discard(job_id)
        self._counts.pop(job_id, None)

    async def _wait_for(self, request_id: str) -> str | None:
        """The request's final status (None if it vanished or took longer than OPERATION_TIMEOUT_S)."""
        return await self.requests.final_status(request_id, OPERATION_TIMEOUT_S)

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("parking task failed", exc_info=task.exception())
