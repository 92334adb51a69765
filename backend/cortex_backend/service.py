"""The service layer: wires store, catalog, scheduler, executor, jobs, requests, logs, managed
training (datasets, training loops, progress records, completion) and the observability parts
(device monitor, event feed, operator metrics, client telemetry) together.

Handlers call into `Service`; the executor reports back to it. Nothing here runs torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from typing import Any

from cortex_nb.protocol import states

from .auth import ensure_admin_token
from .checkpoint_expiry import CheckpointExpiry
from .checkpoint_storage import CheckpointStorage
from .checkpoints import CheckpointManager
from .client_jobs_resume import ClientJobsResume
from .completion import Completion
from .config import BackendSettings
from .data_plane import RequestManager
from .datasets import DatasetStore
from .device_metrics import DeviceMetrics
from .devices import Device
from .drain import Drain
from .events import EventFeed
from .executors.base import Executor
from .executors.choice import create_executor
from .job_views import JobViews
from .jobs import JobManager
from .lineage import Lineage
from .logs import LogBook, run_log_key
from .managed_retries import ManagedRetries
from .models import ModelCatalog, ModelInfo
from .monitor import Monitor
from .operator_metrics import LiveState, OperatorMetrics
from .parking import Parking
from .preemption import Preemption
from .priorities import job_priority_validator
from .progress import ProgressBook, fold_request
from .rate_limits import PerTokenRate
from .resume import Resumer
from .router_replays import RouterReplays
from .runs.manager import RunManager
from .scheduler import Scheduler
from .storage_faults import HeldReports, StorageReserve, is_storage_error
from .store import Store
from .telemetry import TelemetrySink
from .token_streams import TokenStreams
from .training_loops import TrainingLoops
from .uploads import UploadStore
from .weight_syncs import WeightSyncCoordinator

log = logging.getLogger("cortex_backend.service")

HOUSEKEEPING_S = 60.0
STORE_BUSY_TIMEOUT_MS = 50
STORAGE_RESERVE_NAME = "storage-reserve"
# Finished jobs or runs forgotten per housekeeping round at most (each round is a few short transactions).
HISTORY_BATCH = 200


class Service:
    def __init__(self, settings: BackendSettings, executor: Executor | None = None) -> None:
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # The store (job specs, logs, token hashes) and the admin token live here: only the backend's user
        # may enter. mkdir's default left the SQLite file readable by every local user.
        with contextlib.suppress(OSError):
            settings.data_dir.chmod(0o700)
        # Writes wait for another process's database lock only briefly: most are made on the IO loop, and a
        # refused one is retried (reports) or answered 503 (requests) instead of freezing every client.
        self.store = Store(settings.db_path, busy_timeout_ms=STORE_BUSY_TIMEOUT_MS)
        self.storage_reserve = StorageReserve(settings.data_dir / STORAGE_RESERVE_NAME)
        self.held_reports = HeldReports(settings.storage_retry_s, self._storage_gave_up)
        self.catalog = ModelCatalog(settings.models, settings.quantize)
        self.executor = executor or create_executor(settings, self)
        self.devices = self.executor.current_devices()
        self.scheduler = Scheduler(self.devices, aging_s=settings.queue_aging_s)
        self.jobs = JobManager(
            self.store, self.catalog, self.scheduler, self.executor, settings.idle_timeout_s
        )
        self.jobs.validators.append(job_priority_validator(settings.token_max_priority))
        self.checkpoints = CheckpointManager(
            self.store,
            settings.checkpoints_dir,
            settings.checkpoint_quota_bytes,
            settings.checkpoint_min_ttl_s,
        )
        self.weight_sync = WeightSyncCoordinator(self.executor)
        self.requests = RequestManager(
            self.store,
            self.catalog,
            self.jobs,
            self.executor,
            checkpoints=self.checkpoints,
            weight_sync=self.weight_sync,
            router_replays=RouterReplays(settings.router_replay_cache_bytes),
        )
        self.logs = LogBook(self.store, settings.log_retention_lines)
        self.token_streams = TokenStreams()
        self.uploads = UploadStore(settings.uploads_dir, settings.upload_quota_bytes, settings.upload_ttl_s)
        self.jobs.on_job_ended.append(lambda job_id, *_: self.logs.waiters.notify(job_id))
        self.runs = RunManager(
            settings, self.store, self.catalog, self.scheduler, self.logs, self.uploads, self.jobs.admit
        )
        if not self.executor.runs_on_this_host:
            self.runs.unavailable_reason = (
                "source runs execute on the backend's own host, and this backend runs its"
                " work on a cluster's hosts (--executor ray); use a backend with the local executor"
            )
        self._sweeper: asyncio.Task | None = None
        # managed training: datasets, loops in the training worker, progress records, freeing devices
        self.progress = ProgressBook(self.store, self.jobs.waiters.notify)
        # A parked client's own save and load (parking.py) are not the user's: its record ignores them.
        self.requests.on_succeeded.append(
            lambda request, result: (
                None if self.parking.owns(request["id"]) else fold_request(self.progress, request, result)
            )
        )
        self.jobs.on_job_ended.append(lambda job_id, status, *_: self.progress.job_ended(job_id, status))
        self.datasets = DatasetStore(self.store, settings.datasets_dir, settings.dataset_quota_bytes)
        self.training_loops = TrainingLoops(
            self.store,
            self.catalog,
            self.jobs,
            self.requests,
            self.checkpoints,
            self.datasets,
            self.progress,
            self.system_log_line,
        )
        # surviving a stop: SIGTERM drains (drain.py); the next start resumes training runs (resume.py)
        self.drain = Drain(self.store, self.executor, self.requests, self.training_loops)
        self.jobs.validators.insert(0, self.drain.refuse_new_job)
        self.requests.admission_checks.insert(0, self.drain.refuse_request)
        self.resumer = Resumer(
            self.store, self.jobs, self.checkpoints, self.progress, self.training_loops, self.system_log_line
        )
        self.client_jobs_resume = ClientJobsResume(
            self.store, self.jobs, self.requests, self.progress, self.system_log_line
        )
        # a training run's retry policy, and preemption of low-priority runs (--preempt-below)
        self.managed_retries = ManagedRetries(
            self.store,
            self.jobs,
            self.requests,
            self.training_loops,
            self.progress,
            self.resumer,
            self.system_log_line,
        )
        self.preemption = Preemption(
            settings.preempt_below,
            self.store,
            self.scheduler,
            self.executor,
            self.jobs,
            self.requests,
            self.training_loops,
            self.progress,
            self.resumer,
            self.system_log_line,
        )
        # idle Tinker training clients give their device slot back (--park-idle-s)
        self.parking = Parking(
            settings.park_idle_s,
            self.store,
            self.jobs,
            self.requests,
            self.checkpoints,
            self.system_log_line,
        )
        self.completion = Completion(self.store, self.jobs, self.requests, self.progress, self.training_loops)
        self.job_views = JobViews(self.store, self.scheduler, self.jobs, self.progress, self.completion)
        self.checkpoint_storage = CheckpointStorage(self.store, self.jobs, self.checkpoints)
        self.lineage = Lineage(self.store, self.jobs, self.progress)
        # observability
        self.monitor = Monitor(
            self.store,
            self.devices,
            settings.monitor_interval_s,
            settings.metrics_retention_s,
            worker_pid=self.executor.worker_pid,
            rank_pids=self.executor.rank_pids,
            sampler=self.executor.device_sampler(),
        )
        self.device_metrics = DeviceMetrics(self.store, self.jobs, self.monitor)
        self.events = EventFeed(self.store, settings.event_retention)
        self.operator_metrics = OperatorMetrics(
            LiveState(
                capacity=self.scheduler.capacity,
                job_counts=self.store.job_counts_by_status,
                latest_samples=self.monitor.latest,
                gpu_unavailable_reason=lambda: self.monitor.gpu_unavailable_reason,
                log_counts=lambda: {"appended": self.logs.lines_appended, "dropped": self.logs.lines_dropped},
                active_sub_jobs=lambda: len(self.store.active_sub_jobs()),
            )
        )
        self.telemetry = TelemetrySink(self.operator_metrics)
        self.jobs.on_job_ended.append(lambda job_id, *_: self.logs.forget(job_id))
        self._housekeeper: asyncio.Task | None = None
        self.checkpoint_expiry = CheckpointExpiry(self.store, self.checkpoints, self.system_log_line)
        self._expiry_sweeper: asyncio.Task | None = None
        self._parking_sweeper: asyncio.Task | None = None
        self.speedtest_rate = PerTokenRate(settings.speedtest_per_minute, 60.0, "the link speed test")

    async def start(self) -> None:
        ensure_admin_token(self.store, self.settings.admin_token_path)
        await asyncio.to_thread(self.storage_reserve.restore)
        self.uploads.clear()
        self.checkpoints.recover()
        if removed := self.datasets.remove_partial_files():
            log.warning("removed %d partial dataset upload(s) left by the last run", removed)
        if self.settings.fault_injection:
            log.warning(
                "FAULT INJECTION IS ON (%s): this backend is for tests only",
                ", ".join(self.settings.fault_injection),
            )
        resumed = self.resumer.resume_after_restart()
        came_back = self.client_jobs_resume.requeue_after_restart()
        failed = self.jobs.recover_after_restart(self._trained_to_the_end, resumed | came_back)
        self.requests.recover_after_restart()
        if failed:
            log.warning(
                "%d job(s) were in flight at the last stop and are now failed (backend_restarted)", failed
            )
        await self.runs.start()
        await self.executor.start()
        self.client_jobs_resume.load_checkpoints()  # each the first request its job runs
        if resumed or came_back:
            self.jobs.admit()
        self._sweeper = asyncio.create_task(self._sweep_idle_jobs())
        self.monitor.start()
        self._housekeeper = asyncio.create_task(self._housekeeping())
        self._expiry_sweeper = asyncio.create_task(self._sweep_expired_checkpoints())
        if self.parking.enabled:
            self._parking_sweeper = asyncio.create_task(self.parking.run())

    async def stop(self) -> None:
        for task in (self._sweeper, self._housekeeper, self._expiry_sweeper, self._parking_sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.events.stop()
        await self.held_reports.stop()
        await self.runs.stop()
        self.monitor.stop()  # before the executor: a cluster's samples are read through it
        await self.executor.shutdown()
        self.store.close()

    async def _housekeeping(self) -> None:
        """Bound what grows without end (device samples are trimmed by the monitor): the event feed, unused
        upload chunks, remembered Idempotency-Keys, and finished jobs and runs past their retention."""
        settings = self.settings
        interval = min(
            HOUSEKEEPING_S,
            settings.upload_ttl_s / 2,
            settings.idempotency_ttl_s / 2,
            max(1.0, settings.history_retention_s / 2),
        )
        while True:
            for name, chore in (
                ("event feed trim", self.events.trim),
                (
                    "idempotency trim",
                    lambda: self.store.trim_idempotency(time.time() - settings.idempotency_ttl_s),
                ),
                ("history trim", self._forget_old_history),
            ):
                try:
                    chore()
                except Exception:
                    log.exception("%s failed", name)
            try:
                await asyncio.to_thread(self.uploads.sweep)
                await asyncio.to_thread(self.storage_reserve.restore)
            except Exception:
                log.exception("upload sweep failed")
            await asyncio.sleep(interval)

    def _forget_old_history(self) -> None:
        before = time.time() - self.settings.history_retention_s
        jobs = self.store.forget_finished_jobs(before, HISTORY_BATCH)
        runs = self.store.forget_finished_runs(before, HISTORY_BATCH, run_log_key)
        for run_id in runs:
            shutil.rmtree(self.settings.runs_dir / run_id, ignore_errors=True)
        if jobs or runs:
            log.info(
                "forgot %d job(s) and %d run(s) that ended more than %.1f day(s) ago",
                len(jobs),
                len(runs),
                self.settings.history_retention_s / 86400,
            )

    async def _sweep_expired_checkpoints(self) -> None:
        while True:
            await asyncio.sleep(self.checkpoint_expiry.interval_s)
            try:
                self.checkpoint_expiry.sweep()
            except Exception:
                log.exception("checkpoint expiry sweep failed")

    async def _sweep_idle_jobs(self) -> None:
        while True:
            await asyncio.sleep(self.settings.idle_sweep_s)
            try:
                self.completion.sweep()
                # Aging reorders the queue with no event: a holder that now leads and fits starts here.
                self.jobs.admit()
            except Exception:
                log.exception("idle sweep failed")

    def capacity(self) -> dict[str, Any]:
        """Devices and slots (summed and per host), and the executor that runs sub-jobs on them."""
        return {
            **self.scheduler.capacity(),
            "executor": self.executor.describe(),
            "source_runs": self.runs.sandbox_view(),
            "quantized_models": self.catalog.quantized(),
        }

    def _trained_to_the_end(self, job_id: str) -> bool:
        """After a restart: was this job's training over (a keep-alive cut short), so that it is done?"""
        progress = self.store.get_progress(job_id) or {}
        return progress.get("source") == states.PROGRESS_MANAGED and progress.get("phase") in (
            states.PHASE_KEEP_ALIVE,
            states.PHASE_FINISHED,
        )

    def system_log_line(self, job_id: str, line: str) -> None:
        """A line from the backend itself in a job's logs."""
        sub_job_id = next((sub["id"] for sub in self.store.sub_jobs(job_id)), "job")
        self.logs.append(job_id, sub_job_id, "stdout", [(time.time(), line)])

    def has_work(self) -> bool:
        """Jobs queued or running, or source runs: what keeps a local backend from exiting when idle."""
        active = (states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING)
        return bool(self.store.jobs_with_status(active) or self.store.runs_with_status(active))

    # ExecutorListener ---------------------------------------------------------------------------
    # Every report about a job goes through `held_reports`: applied now, or held in order and retried while
    # the store refuses writes; it never raises into the executor's reader.
    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None:
        self.held_reports.deliver(job_id, self.jobs.sub_job_ready, job_id, sub_job_id, info)

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None:
        self.held_reports.deliver(job_id, self.jobs.sub_job_failed, job_id, sub_job_id, code, message)

    def sub_job_waits_for_room(self, job_id: str, sub_job_id: str, reason: str) -> None:
        self.held_reports.deliver(job_id, self.jobs.sub_job_waits_for_room, job_id, sub_job_id, reason)

    def request_started(self, job_id: str, request_id: str) -> None:
        self.held_reports.deliver(job_id, self.requests.started, job_id, request_id)

    def request_finished(self, job_id: str, request_id: str, message: dict[str, Any], blob: bytes) -> None:
        self.held_reports.deliver(job_id, self.requests.finished, job_id, request_id, message, blob)

    def log_lines(self, job_id: str, sub_job_id: str, stream: str, lines: list[tuple[float, str]]) -> None:
        self.held_reports.deliver(job_id, self.logs.append, job_id, sub_job_id, stream, lines, droppable=True)

    def sync_message(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        self.held_reports.deliver(job_id, self.weight_sync.route, job_id, sub_job_id, header, blob)

    def loop_message(self, job_id: str, sub_job_id: str, header: dict[str, Any]) -> None:
        self.held_reports.deliver(job_id, self.training_loops.on_message, job_id, sub_job_id, header)

    def request_tokens(self, job_id: str, request_id: str, samples: list[dict[str, Any]]) -> None:
        # Live news for a streaming reply, never stored: nothing to hold while the store refuses writes.
        self.token_streams.feed(request_id, samples)

    def _storage_gave_up(self, job_id: str, error: BaseException) -> None:
        """The store refused a job's writes for `storage_retry_s`: fail the job, keeping what was recorded,
        and free its devices. On a full disk the reserve is given up so that the failure can be recorded."""
        message = (
            f"the backend could not record this job's progress for {self.settings.storage_retry_s:g} s"
            f" ({error}); what was recorded before is kept. Free space in the backend's data dir (or end"
            " what holds its database lock), then create a new job (and load its last checkpoint)"
        )
        log.error("job %s failed: storage_unavailable (%s)", job_id, error)
        self.storage_reserve.release()
        try:
            self.jobs.end(job_id, states.JOB_FAILED, "storage_unavailable", message)
            return
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            log.error("could not record the failure of job %s (%s); freeing its devices anyway", job_id, exc)
        self.jobs.free_devices(job_id)
        # Recorded once the store takes writes again.
        asyncio.get_running_loop().call_later(
            1.0, lambda: self.held_reports.deliver(job_id, self._storage_gave_up, job_id, error)
        )

    def devices_changed(self, devices: list[Device], host_models: dict[str, ModelInfo]) -> None:
        self.devices = devices
        self.catalog.set_host_models(host_models)
        self.scheduler.set_devices(devices)
        self.monitor.set_devices(devices)
        self.jobs.devices_changed()
