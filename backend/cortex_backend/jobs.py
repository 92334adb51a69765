"""Job lifecycle: create, queue for devices, start sub-jobs, and end as done, failed or cancelled.

pending (waiting for a device) -> starting (workers loading the model) -> running -> terminal.
Ending a job stops its workers, fails or cancels its unfinished requests, frees its devices and
admits whoever waits next. A job whose adapter-host slot does not fit in memory yet goes from starting
back to pending, and waits there for a slot of its device to free (room_waits.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.priority import DEFAULT_PRIORITY
from cortex_nb.protocol.schemas.jobs import CreateJob, UpdateJob

from .auth import Principal
from .devices import Device
from .executors.base import Executor, SubJobAssignment
from .models import ModelCatalog
from .pagination import ListingFilter, parse_cursor, split_page
from .scheduler import Scheduler
from .stats import span_closed
from .store import Store
from .validation import validate_job
from .waiters import Waiters

log = logging.getLogger("cortex_backend.jobs")


def new_job_id() -> str:
    return "job-" + secrets.token_hex(6)


def queue_key(job_id: str) -> str:
    """The waiter key a long-poll of a waiting job wakes on when the queue moves."""
    return f"queue:{job_id}"


def public_job(job: dict[str, Any]) -> dict[str, Any]:
    """The JSON a client sees for a job."""
    return {
        "job_id": job["id"],
        "owner": job["owner"],
        "name": job["name"],
        "experiment": job["experiment"],
        "status": job["status"],
        "failure_code": job["failure_code"],
        "failure_message": job["failure_message"],
        "created_at": job["created_at"],
        "started_at": job["started_at"],
        "finished_at": job["finished_at"],
        "last_activity_at": job["last_activity_at"],
        "idle_timeout_s": job["spec"].get("idle_timeout_s"),
        "labels": job["spec"].get("labels") or {},
        "priority": job["spec"].get("priority", DEFAULT_PRIORITY),
        "sub_jobs": [
            {
                "sub_job_id": sub["id"],
                "type": sub["type"],
                "status": sub["status"],
                "base_model": sub["spec"]["base_model"],
                "lora": sub["spec"].get("lora"),
                "optimizer": sub["spec"].get("optimizer"),
                "seed": sub["spec"].get("seed"),
                "max_seq_len": sub["spec"].get("max_seq_len"),
                "device": sub["device"],
                "failure_code": sub["failure_code"],
                "failure_message": sub["failure_message"],
                "info": sub["info"],
            }
            for sub in job["sub_jobs"]
        ],
    }


class JobManager:
    def __init__(
        self,
        store: Store,
        catalog: ModelCatalog,
        scheduler: Scheduler,
        executor: Executor,
        default_idle_timeout_s: float,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.scheduler = scheduler
        self.executor = executor
        self.default_idle_timeout_s = default_idle_timeout_s
        self.waiters = Waiters()
        # Called with (job_id, status, code, message) when a job ends, so requests and logs can react.
        self.on_job_ended: list[Callable[[str, str, str | None, str | None], None]] = []
        # Called with the job id when all its sub-jobs are up (a managed loop starts then).
        self.on_job_running: list[Callable[[str], None]] = []
        # Called with (job_id, code, message) before a job is failed; one that returns True has taken the
        # failure over (a training run's retry policy, managed_retries.py) and the job does not end.
        self.failure_handlers: list[Callable[[str, str | None, str | None], bool]] = []
        # Checks beyond the job spec's own (e.g. a training loop's datasets): each returns the spec to keep.
        self.validators: list[Callable[[Principal, dict[str, Any]], dict[str, Any]]] = []
        self._completing: set[str] = set()
        # Jobs being set aside to wait for adapter-host memory (their workers stopping).
        self._setting_aside_for_room: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    # queries ----------------------------------------------------------------------------------
    def visible_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """The job if this principal may see it; otherwise the same 404 as a job that does not exist."""
        job = self.store.get_job(job_id)
        if job is None or not principal.can_see(job["owner"]):
            raise _not_visible(job_id)
        return job

    def check_visible(self, principal: Principal, job_id: str) -> None:
        """`visible_job`'s check alone, reading only the job's owner (a request poll needs no more)."""
        owner = self.store.job_owner(job_id)
        if owner is None or not principal.can_see(owner):
            raise _not_visible(job_id)

    def list(
        self,
        principal: Principal,
        status: str | None,
        limit: int,
        cursor: str | None,
        filters: ListingFilter | None = None,
    ) -> dict[str, Any]:
        """A page of job records (render each with `JobViews.render`) and the next cursor. `filters` (from
        `listings.listing_filter`, which settles whose jobs) replaces `status` when given."""
        owner = None if principal.is_admin else principal.owner
        page, next_cursor = split_page(
            self.store.list_jobs(owner, status, limit + 1, parse_cursor(cursor), filters), limit
        )
        return {"jobs": page, "next_cursor": next_cursor}

    async def wait_for_change(
        self,
        principal: Principal,
        job_id: str,
        from_status: str | None,
        wait_s: float,
        also_wake_on: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """The job, once its status differs from `from_status` (or another of `also_wake_on` fires), or
        after `wait_s`. With `from_status` None, any of `also_wake_on` or a status change wakes it."""
        job = self.visible_job(principal, job_id)
        waiting = from_status is None or job["status"] == from_status
        if waiting and wait_s > 0 and (from_status is not None or also_wake_on):
            await self.waiters.wait_any((job_id, *also_wake_on), wait_s)
            job = self.visible_job(principal, job_id)
        return job

    # create -----------------------------------------------------------------------------------
    def create(self, principal: Principal, body: CreateJob) -> dict[str, Any]:
        spec = validate_job(body, self.catalog)
        for validate in self.validators:
            spec = validate(principal, spec)
        job_id = spec.get("job_id") or new_job_id()
        if self.store.job_exists(job_id):
            # The same answer whoever owns it: job ids are global, and naming the job would confirm it to anyone.
            raise ApiError(
                "job_id_unavailable",
                "this job_id cannot be used; choose another job_id, or omit it to get a fresh one",
                {"field": "job_id"},
            )
        self._check_ranks(spec)
        slots, min_memory, models = _placement_needs(spec)
        hostable = self._hostable_entries(spec)
        if not self.scheduler.fits_ever(slots, min_memory, models=models, hostable=hostable):
            missing = self._models_on_no_host(models)
            if missing:
                raise ApiError(
                    "no_host_for_model", _no_host_message(missing), {"field": "sub_jobs", "models": missing}
                )
            raise ApiError(
                "exceeds_capacity",
                f"the job needs {slots} device slot(s)"
                + (f" with at least {min_memory / 2**30:g} GiB" if min_memory else "")
                + " but this backend cannot give that (GET /v1/capacity shows its devices)",
                {"field": "sub_jobs"},
            )
        spec.setdefault("idle_timeout_s", self.default_idle_timeout_s)
        counts: dict[str, int] = {}
        sub_jobs = []
        for sub in spec["sub_jobs"]:
            index = counts.get(sub["type"], 0)
            counts[sub["type"]] = index + 1
            sub_jobs.append(
                {
                    "id": f"{sub['type']}-{index}",
                    "type": sub["type"],
                    "status": states.JOB_PENDING,
                    "spec": sub,
                }
            )
        self.store.insert_job(
            {
                "id": job_id,
                "owner": principal.owner,
                "name": spec.get("name"),
                "experiment": spec.get("experiment"),
                "status": states.JOB_PENDING,
                "spec": spec,
            },
            sub_jobs,
        )
        job = self.store.get_job(job_id)
        self.scheduler.enqueue(
            job_id,
            slots,
            min_memory,
            models=models,
            priority=spec.get("priority", DEFAULT_PRIORITY),
            submitted_at=job["created_at"],
            hostable=hostable,
        )
        self.admit()
        return self.store.get_job(job_id)

    def _hostable_entries(self, spec: dict[str, Any]) -> tuple[bool, ...]:
        """For each device slot the job asks for, whether its sub-job may be a slot of an adapter host (one
        device, an unquantized base; executors/base.py `Hosting.hosts` decides the same on the device)."""
        entries: list[bool] = []
        for sub in spec["sub_jobs"]:
            count = int(sub.get("n_gpus") or 1)
            try:
                quantized = bool(self.catalog.get(sub["base_model"]).quantization)
            except ApiError:  # a model gone since: its sub-job fails at start, whatever it counts as here
                quantized = True
            entries.extend([count == 1 and not quantized] * count)
        return tuple(entries)

    def _check_ranks(self, spec: dict[str, Any]) -> None:
        """A sub-job across devices needs that many devices of one kind: distinct GPUs, or CPU slots; a
        sampling one, devices that sample with vLLM (its tensor parallelism)."""
        gpus = [device for device in self.scheduler.devices if device.kind == "cuda"]
        most = len(gpus) if gpus else sum(device.slots for device in self.scheduler.devices)
        for index, sub in enumerate(spec["sub_jobs"]):
            n_gpus = int(sub.get("n_gpus") or 1)
            engines = sorted({device.sampler or "transformers" for device in self.scheduler.devices})
            if n_gpus > 1 and sub["type"] == states.SAMPLING and engines != ["vllm"]:
                raise ApiError(
                    "multi_gpu_sampling_unsupported",
                    f"sub_jobs[{index}].n_gpus={n_gpus}: a sampling sub-job spans devices with vLLM's tensor"
                    f" parallelism, and this backend's devices sample with {', '.join(engines) or 'nothing'}"
                    " (start it with --sampler vllm, or --sampler auto on GPUs with vLLM installed). Use"
                    " n_gpus: 1, or several sampling sub-jobs",
                    {"field": f"sub_jobs[{index}].n_gpus"},
                )
            if n_gpus > 1 and n_gpus > most:
                raise ApiError(
                    "exceeds_capacity",
                    f"sub_jobs[{index}].n_gpus={n_gpus}: this backend has {most}"
                    + (" GPU(s)" if gpus else " CPU slot(s)")
                    + " for the ranks of one sub-job (GET /v1/capacity shows its devices)",
                    {"field": f"sub_jobs[{index}].n_gpus"},
                )

    def requeue(self, job: dict[str, Any]) -> None:
        """Put a stored job back in the queue (a training run resumed after a restart, retried or
        preempted) at its own priority and submission time; admitted by the next `admit`."""
        slots, min_memory, models = _placement_needs(job["spec"])
        self.scheduler.enqueue(
            job["id"],
            slots,
            min_memory,
            models=models,
            priority=job["spec"].get("priority", DEFAULT_PRIORITY),
            submitted_at=job["created_at"],
            hostable=self._hostable_entries(job["spec"]),
        )

    def queue_moved(self) -> None:
        """Wake long-polls of waiting jobs: their place in the queue or its reason may have changed."""
        for holder_id in self.scheduler.pending_holders():
            self.waiters.notify(queue_key(holder_id))

    # hosts that come and go (a cluster) ----------------------------------------------------------
    def devices_changed(self) -> None:
        """Hosts joined or left: a pending job that no host left can ever run fails now, clearly; the
        others keep their place in the queue. (Running sub-jobs on a lost host are failed by the executor.)"""
        for job_id in self.scheduler.pending_that_never_fit():
            job = self.store.get_job(job_id)
            if job is None:
                continue
            models = frozenset(sub["spec"]["base_model"] for sub in job["sub_jobs"])
            missing = self._models_on_no_host(models)
            if missing:
                self.end(job_id, states.JOB_FAILED, "no_host_for_model", _no_host_message(missing))
            else:
                self.end(
                    job_id,
                    states.JOB_FAILED,
                    "exceeds_capacity",
                    f"the hosts left can never hold its {len(job['sub_jobs'])} sub-job(s); GET /v1/capacity shows them",
                )
        self.admit()
        self.queue_moved()

    def _models_on_no_host(self, models: frozenset[str]) -> list[str]:
        served = self.scheduler.models_served()
        return [] if served is None else sorted(models - served)

    def admit(self) -> None:
        for job_id, placement in self.scheduler.admit():
            job = self.store.get_job(job_id)
            if job is None or job["status"] in states.JOB_TERMINAL:
                self.scheduler.release(job_id)
                continue
            self._set_job_status(job_id, states.JOB_STARTING, started_at=time.time())
            self.scheduler.room_waits.admitted(job_id, {device.id for device in placement})
            for sub, devices in zip(job["sub_jobs"], _per_sub_job(job["sub_jobs"], placement), strict=True):
                device = devices[0]
                self.store.update_sub_job(job_id, sub["id"], status=states.JOB_STARTING, device=device.id)
                assignment = SubJobAssignment(
                    job_id,
                    sub["id"],
                    sub["type"],
                    sub["spec"],
                    self.catalog.get(sub["spec"]["base_model"]),
                    device,
                    tuple(devices) if len(devices) > 1 else (),
                )
                self._spawn(self.executor.start_sub_job(assignment))

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_task_failure)

    # executor callbacks -------------------------------------------------------------------------
    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None:
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        self.store.update_sub_job(job_id, sub_job_id, status=states.JOB_RUNNING, info=info)
        sub_jobs = self.store.sub_jobs(job_id)
        device = next((sub["device"] for sub in sub_jobs if sub["id"] == sub_job_id), None)
        if device is not None:
            self.scheduler.room_waits.slot_ready(job_id, device)
        if all(sub["status"] == states.JOB_RUNNING for sub in sub_jobs):
            self.scheduler.room_waits.ran(job_id)
            self._set_job_status(job_id, states.JOB_RUNNING)
            self.store.touch_job(job_id)
            for callback in self.on_job_running:
                callback(job_id)

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None:
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        self.store.update_sub_job(
            job_id, sub_job_id, status=states.JOB_FAILED, failure_code=code, failure_message=message
        )
        self.end(job_id, states.JOB_FAILED, code, f"{sub_job_id}: {message}")

    def sub_job_waits_for_room(self, job_id: str, sub_job_id: str, reason: str) -> None:
        """A sub-job's adapter-host slot does not fit in memory now but would once another slot of its device
        frees: stop the job's workers and queue it again, waiting with `reason` (room_waits.py)."""
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL or job_id in self._setting_aside_for_room:
            return
        device = next((sub["device"] for sub in job["sub_jobs"] if sub["id"] == sub_job_id), None)
        if device is None:
            return
        self._setting_aside_for_room.add(job_id)
        # Waiting from now: a slot that frees while its workers stop wakes it.
        self.scheduler.room_waits.refused(job_id, device, f"{sub_job_id}: {reason}")
        self._spawn(self._queue_again_for_room(job_id))

    async def _queue_again_for_room(self, job_id: str) -> None:
        try:
            await self.set_aside(job_id)
        finally:
            self._setting_aside_for_room.discard(job_id)
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            self.scheduler.room_waits.forget(job_id)
            return
        with self.store.transaction():
            for sub in job["sub_jobs"]:
                self.store.update_sub_job(job_id, sub["id"], status=states.JOB_PENDING, device=None)
            self.store.update_job(job_id, status=states.JOB_PENDING, **span_closed(job))
        self.waiters.notify(job_id)
        self.requeue(job)
        retry_in = self.scheduler.room_waits.retry_in(job_id)  # a slot freed while it was starting
        if retry_in:
            asyncio.get_running_loop().call_later(retry_in, self._admit_and_tell)
        self.admit()
        self.queue_moved()

    # ending -----------------------------------------------------------------------------------
    def update(self, principal: Principal, job_id: str, body: UpdateJob) -> dict[str, Any]:
        """Rename a job or replace its labels (the caller's own job, or any for an admin); its state is
        untouched. A job another owner holds is the same 404 as one that does not exist."""
        job = self.visible_job(principal, job_id)
        fields: dict[str, Any] = {}
        if body.name is not None:
            fields["name"] = body.name
        if body.labels is not None:
            spec = dict(job["spec"])
            spec["labels"] = dict(body.labels)
            fields["spec"] = json.dumps(spec)
        self.store.update_job(job_id, **fields)
        self.waiters.notify(job_id)
        return self.visible_job(principal, job_id)

    def cancel(self, principal: Principal, job_id: str) -> dict[str, Any]:
        job = self.visible_job(principal, job_id)
        if job["status"] not in states.JOB_TERMINAL:
            self.end(job_id, states.JOB_CANCELLED, "cancelled", "cancelled by the user")
        return self.store.get_job(job_id)

    def finish_when_drained(self, job_id: str, has_active_requests: Callable[[str], bool]) -> None:
        """End a job normally once its queued requests have run (at once if none), freeing its devices."""
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        if job["status"] != states.JOB_PENDING and has_active_requests(job_id):
            self._completing.add(job_id)
        else:
            self.end(job_id, states.JOB_DONE, None, None)

    def is_completing(self, job_id: str) -> bool:
        return job_id in self._completing

    def request_drained(self, job_id: str) -> None:
        """Called when a job's last active request finishes; ends a job that was asked to complete."""
        if job_id in self._completing:
            self.end(job_id, states.JOB_DONE, None, None)

    def end(self, job_id: str, status: str, code: str | None, message: str | None) -> None:
        job = self.store.get_job(job_id)
        if job is None or job["status"] in states.JOB_TERMINAL:
            return
        if status == states.JOB_FAILED and any(
            handler(job_id, code, message) for handler in self.failure_handlers
        ):
            return
        self.scheduler.room_waits.forget(job_id)
        # The job's end is one write: refused (disk full, lock held), nothing changed and the caller may retry.
        with self.store.transaction():
            for sub in job["sub_jobs"]:
                if sub["status"] not in states.JOB_TERMINAL:
                    self.store.update_sub_job(job_id, sub["id"], status=status)
            self._set_job_status(
                job_id,
                status,
                failure_code=code if status != states.JOB_DONE else None,
                failure_message=message if status != states.JOB_DONE else None,
                finished_at=time.time(),
            )
        self._completing.discard(job_id)
        try:
            for callback in self.on_job_ended:
                try:
                    callback(job_id, status, code, message)
                except (
                    Exception
                ):  # what a callback records is secondary: the devices are freed whatever it meets
                    log.exception("recording the end of job %s failed", job_id)
        finally:
            self.free_devices(job_id)

    def free_devices(self, job_id: str) -> None:
        """Stop the job's workers and free its device slots once they have exited, not when they are asked
        to: a worker finishing its operation still holds the device's memory, and the next job would start
        beside it. Meanwhile the slots show as freeing (queue reasons say so)."""
        sub_job_ids = [sub["id"] for sub in self.store.sub_jobs(job_id)]
        self.scheduler.withdraw(job_id)
        if self.scheduler.placement(job_id) is None:
            for sub_job_id in sub_job_ids:
                self._spawn(self.executor.stop_sub_job(job_id, sub_job_id))
            self.admit()
            self.queue_moved()
            return
        if not self.scheduler.mark_freeing(job_id):
            return  # already being freed
        self._spawn(self._free_when_stopped(job_id, sub_job_ids))
        self.queue_moved()

    async def set_aside(self, job_id: str) -> None:
        """Stop a job's workers and free its device slots without ending it: it is queued again (a managed
        run retried or preempted). Returns once the slots are free."""
        sub_job_ids = [sub["id"] for sub in self.store.sub_jobs(job_id)]
        if self.scheduler.placement(job_id) is None:
            await asyncio.gather(
                *(self.executor.stop_sub_job(job_id, sub_job_id) for sub_job_id in sub_job_ids),
                return_exceptions=True,
            )
            return
        self.scheduler.mark_freeing(job_id)
        self.queue_moved()
        await self._free_when_stopped(job_id, sub_job_ids)

    async def _free_when_stopped(self, job_id: str, sub_job_ids: list[str]) -> None:
        try:
            await asyncio.gather(
                *(self.executor.stop_sub_job(job_id, sub_job_id) for sub_job_id in sub_job_ids),
                return_exceptions=True,
            )
        finally:
            # A job that held a slot there may have made room for jobs waiting for adapter-host memory.
            for delay in self.scheduler.room_waits.released(job_id):
                asyncio.get_running_loop().call_later(delay, self._admit_and_tell)
            self.scheduler.release(job_id)
            self.admit()
            self.queue_moved()

    def _admit_and_tell(self) -> None:
        """Admit whoever may start now (a job whose backoff after a refusal for memory has passed)."""
        self.admit()
        self.queue_moved()

    def _set_job_status(self, job_id: str, status: str, **fields: Any) -> None:
        self.store.update_job(job_id, status=status, **fields)
        self.waiters.notify(job_id)

    # housekeeping -------------------------------------------------------------------------------
    def recover_after_restart(
        self,
        trained_to_the_end: Callable[[str], bool] = lambda job_id: False,
        resumed: frozenset[str] | set[str] = frozenset(),
    ) -> int:
        """Jobs that were in flight when the backend stopped cannot continue: fail them, clearly. A job
        whose training had ended (a training run sampling in its keep-alive) is marked as it really
        ended: done. Training runs queued again by resume.py (`resumed`) are left alone. `on_job_ended`
        callbacks hear of each, as of any job that ends."""
        stale = self.store.jobs_with_status([states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING])
        failed = 0
        for job in stale:
            if job["id"] in resumed:
                continue
            if trained_to_the_end(job["id"]):
                for sub in job["sub_jobs"]:
                    if sub["status"] not in states.JOB_TERMINAL:
                        self.store.update_sub_job(job["id"], sub["id"], status=states.JOB_DONE)
                self.store.update_job(job["id"], status=states.JOB_DONE, finished_at=time.time())
                for callback in self.on_job_ended:
                    callback(job["id"], states.JOB_DONE, None, None)
                continue
            failed += 1
            for sub in job["sub_jobs"]:
                if sub["status"] not in states.JOB_TERMINAL:
                    self.store.update_sub_job(
                        job["id"], sub["id"], status=states.JOB_FAILED, failure_code="backend_restarted"
                    )
            self.store.update_job(
                job["id"],
                status=states.JOB_FAILED,
                failure_code="backend_restarted",
                failure_message=_restarted_message(self.store, job["id"]),
                finished_at=time.time(),
            )
            for callback in self.on_job_ended:
                callback(job["id"], states.JOB_FAILED, "backend_restarted", None)
        return failed

    def idle_timeout_s(self, job: dict[str, Any]) -> float | None:
        """Seconds a running job may have nothing to do before it is completed; None: never (0 in its spec)."""
        timeout = job["spec"].get("idle_timeout_s")
        if timeout is None:
            timeout = self.default_idle_timeout_s
        return float(timeout) if timeout else None


def _placement_needs(spec: dict[str, Any]) -> tuple[int, int, frozenset[str]]:
    """What a job asks of the scheduler: device slots, memory per device, base models."""
    slots = sum(int(sub.get("n_gpus") or 1) for sub in spec["sub_jobs"])
    min_memory = int(float((spec.get("hardware") or {}).get("min_memory_gib", 0)) * 2**30)
    return slots, min_memory, frozenset(sub["base_model"] for sub in spec["sub_jobs"])


def _per_sub_job(sub_jobs: list[dict[str, Any]], placement: list[Device]) -> list[list[Device]]:
    """The placement cut into each sub-job's devices: `n_gpus` slots each, in order."""
    cut, start = [], 0
    for sub in sub_jobs:
        count = int(sub["spec"].get("n_gpus") or 1)
        cut.append(placement[start : start + count])
        start += count
    return cut


def _restarted_message(store: Store, job_id: str) -> str:
    """Why an in-flight job failed at a restart, naming its newest checkpoint to start again from."""
    rows = store.list_checkpoints(job_id)
    newest = max(rows, key=lambda row: (row["step"], row["created_at"]), default=None)
    if newest is None:
        return "the backend restarted while this job was in flight; create a new job and submit again"
    return (
        f"the backend restarted while this job was in flight; create a new job and load its newest"
        f" checkpoint {newest['id']!r} (step {newest['step']}, {newest['type']}) with"
        f" load(checkpoint_id={newest['id']!r}, source_job_id={job_id!r})"
    )


def _no_host_message(models: list[str]) -> str:
    return (
        f"no host in the cluster has model {models[0]!r} now; add one that has it with"
        f" `cortex-nb host join HEAD_ADDRESS --model {models[0]}=DIR` (GET /v1/capacity lists each host's models)"
    )


def _log_task_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())


def _not_visible(job_id: str) -> ApiError:
    """A job this principal may not see answers as one that does not exist."""
    return ApiError(
        "job_not_found", f"no job {job_id!r} is visible to this token; list yours with GET /v1/jobs"
    )
