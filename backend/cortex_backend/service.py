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
from .checkpoints import CheckpointManager
from .completion import Completion
from .config import BackendSettings
from .data_plane import RequestManager
from .datasets import DatasetStore
from .device_metrics import DeviceMetrics
from .devices import Device
from .events import EventFeed
from .executor import Executor, create_executor
from .job_views import JobViews
from .jobs import JobManager
from .logs import LogBook, run_log_key
from .models import ModelCatalog, ModelInfo
from .monitor import Monitor
from .operator_metrics import LiveState, OperatorMetrics
from .progress import ProgressBook, fold_request
from .runs.manager import RunManager
from .scheduler import Scheduler
from .store import Store
from .telemetry import TelemetrySink
from .training_loops import TrainingLoops
from .uploads import UploadStore
from .weight_syncs import WeightSyncCoordinator

log = logging.getLogger("cortex_backend.service")

HOUSEKEEPING_S = 60.0
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
        self.store = Store(settings.db_path)
        self.catalog = ModelCatalog(settings.models)
        self.executor = executor or create_executor(settings, self)
        self.devices = self.executor.current_devices()
        self.scheduler = Scheduler(self.devices)
        self.jobs = JobManager(
            self.store, self.catalog, self.scheduler, self.executor, settings.idle_timeout_s
        )
        self.checkpoints = CheckpointManager(
            self.store, settings.checkpoints_dir, settings.checkpoint_quota_bytes
        )
        self.weight_sync = WeightSyncCoordinator(self.executor)
        self.requests = RequestManager(
            self.store,
            self.catalog,
            self.jobs,
            self.executor,
            checkpoints=self.checkpoints,
            weight_sync=self.weight_sync,
        )
        self.logs = LogBook(self.store, settings.log_retention_lines)
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
        self.requests.on_succeeded.append(
            lambda request, result: fold_request(self.progress, request, result)
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
        self.completion = Completion(self.store, self.jobs, self.requests, self.progress, self.training_loops)
        self.job_views = JobViews(self.store, self.scheduler, self.jobs, self.progress, self.completion)
        # observability
        self.monitor = Monitor(
            self.store,
            self.devices,
            settings.monitor_interval_s,
            settings.metrics_retention_s,
            worker_pid=self.executor.worker_pid,
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

    async def start(self) -> None:
        ensure_admin_token(self.store, self.settings.admin_token_path)
        self.uploads.clear()
        self.checkpoints.recover()
        if self.settings.fault_injection:
            log.warning(
                "FAULT INJECTION IS ON (%s): this backend is for tests only",
                ", ".join(self.settings.fault_injection),
            )
        failed = self.jobs.recover_after_restart(self._trained_to_the_end)
        self.requests.recover_after_restart()
        if failed:
            log.warning(
                "%d job(s) were in flight at the last stop and are now failed (backend_restarted)", failed
            )
        await self.runs.start()
        await self.executor.start()
        self._sweeper = asyncio.create_task(self._sweep_idle_jobs())
        self.monitor.start()
        self._housekeeper = asyncio.create_task(self._housekeeping())

    async def stop(self) -> None:
        for task in (self._sweeper, self._housekeeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.events.stop()
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

    async def _sweep_idle_jobs(self) -> None:
        while True:
            await asyncio.sleep(self.settings.idle_sweep_s)
            try:
                self.completion.sweep()
            except Exception:
                log.exception("idle sweep failed")

    def capacity(self) -> dict[str, Any]:
        """Devices and slots (summed and per host), and the executor that runs sub-jobs on them."""
        return {**self.scheduler.capacity(), "executor": self.executor.describe()}

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
    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None:
        self.jobs.sub_job_ready(job_id, sub_job_id, info)

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None:
        self.jobs.sub_job_failed(job_id, sub_job_id, code, message)

    def request_started(self, job_id: str, request_id: str) -> None:
        self.requests.started(job_id, request_id)

    def request_finished(self, job_id: str, request_id: str, message: dict[str, Any], blob: bytes) -> None:
        self.requests.finished(job_id, request_id, message, blob)

    def log_lines(self, job_id: str, sub_job_id: str, stream: str, lines: list[tuple[float, str]]) -> None:
        self.logs.append(job_id, sub_job_id, stream, lines)

    def sync_message(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        self.weight_sync.route(job_id, sub_job_id, header, blob)

    def loop_message(self, job_id: str, sub_job_id: str, header: dict[str, Any]) -> None:
        self.training_loops.on_message(job_id, sub_job_id, header)

    def devices_changed(self, devices: list[Device], host_models: dict[str, ModelInfo]) -> None:
        self.devices = devices
        self.catalog.set_host_models(host_models)
        self.scheduler.set_devices(devices)
        self.monitor.set_devices(devices)
        self.jobs.devices_changed()
