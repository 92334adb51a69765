"""The service layer: wires store, catalog, scheduler, executor, jobs, requests, logs, managed
training (datasets, training loops, progress records, completion) and the observability parts
(device monitor, event feed, operator metrics, client telemetry) together.

Handlers call into `Service`; the executor reports back to it. Nothing here runs torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from cortex_nb import states

from .auth import ensure_admin_token
from .checkpoints import CheckpointManager
from .completion import Completion
from .config import BackendSettings
from .datasets import DatasetStore
from .device_metrics import DeviceMetrics
from .devices import detect_devices
from .events import EventFeed
from .executor import Executor, LocalExecutor
from .job_views import JobViews
from .jobs import JobManager
from .logs import LogBook
from .models import ModelCatalog
from .monitor import Monitor
from .operator_metrics import LiveState, OperatorMetrics
from .progress import ProgressBook, fold_request
from .requests import RequestManager
from .runs.manager import RunManager
from .samplers import assign_samplers
from .scheduler import Scheduler
from .store import Store
from .telemetry import TelemetrySink
from .training_loops import TrainingLoops
from .uploads import UploadStore
from .weight_sync import WeightSyncCoordinator

log = logging.getLogger("cortex_backend.service")

HOUSEKEEPING_S = 60.0


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
        self.devices = assign_samplers(detect_devices(settings.devices, settings.sub_jobs_per_device), settings.sampler)
        self.scheduler = Scheduler(self.devices)
        self.executor = executor or LocalExecutor(self, self.devices, settings.warm_workers, settings.worker_threads,
                                                  faults=settings.fault_injection, sampler_options=settings.sampler_options)
        self.jobs = JobManager(self.store, self.catalog, self.scheduler, self.executor, settings.idle_timeout_s)
        self.checkpoints = CheckpointManager(self.store, settings.checkpoints_dir, settings.checkpoint_quota_bytes)
        self.weight_sync = WeightSyncCoordinator(self.executor)
        self.requests = RequestManager(self.store, self.catalog, self.jobs, self.executor,
                                       checkpoints=self.checkpoints, weight_sync=self.weight_sync)
        self.logs = LogBook(self.store, settings.log_retention_lines)
        self.uploads = UploadStore(settings.uploads_dir)
        self.jobs.on_job_ended.append(lambda job_id, *_: self.logs.waiters.notify(job_id))
        self.runs = RunManager(settings, self.store, self.catalog, self.scheduler, self.logs, self.uploads, self.jobs.admit)
        self._sweeper: asyncio.Task | None = None
        # managed training: datasets, loops in the training worker, progress records, freeing devices
        self.progress = ProgressBook(self.store, self.jobs.waiters.notify)
        self.requests.on_succeeded.append(lambda request, result: fold_request(self.progress, request, result))
        self.jobs.on_job_ended.append(lambda job_id, status, *_: self.progress.job_ended(job_id, status))
        self.datasets = DatasetStore(self.store, settings.datasets_dir)
        self.training_loops = TrainingLoops(self.store, self.catalog, self.jobs, self.requests, self.checkpoints,
                                            self.datasets, self.progress, self.system_log_line)
        self.completion = Completion(self.store, self.jobs, self.requests, self.progress, self.training_loops)
        self.job_views = JobViews(self.store, self.scheduler, self.jobs, self.progress, self.completion)
        # observability
        self.monitor = Monitor(self.store, self.devices, settings.monitor_interval_s, settings.metrics_retention_s,
                               worker_pid=self.executor.worker_pid)
        self.device_metrics = DeviceMetrics(self.store, self.jobs, self.monitor)
        self.events = EventFeed(self.store, settings.event_retention)
        self.operator_metrics = OperatorMetrics(LiveState(
            capacity=self.scheduler.capacity,
            job_counts=self.store.job_counts_by_status,
            latest_samples=self.monitor.latest,
            gpu_unavailable_reason=lambda: self.monitor.gpu_unavailable_reason,
            log_counts=lambda: {"appended": self.logs.lines_appended, "dropped": self.logs.lines_dropped},
            active_sub_jobs=lambda: len(self.store.active_sub_jobs()),
        ))
        self.telemetry = TelemetrySink(self.operator_metrics)
        self.jobs.on_job_ended.append(lambda job_id, *_: self.logs.forget(job_id))
        self._housekeeper: asyncio.Task | None = None

    async def start(self) -> None:
        ensure_admin_token(self.store, self.settings.admin_token_path)
        self.uploads.clear()
        self.checkpoints.recover()
        if self.settings.fault_injection:
            log.warning("FAULT INJECTION IS ON (%s): this backend is for tests only", ", ".join(self.settings.fault_injection))
        failed = self.jobs.recover_after_restart(self._trained_to_the_end)
        self.requests.recover_after_restart()
        if failed:
            log.warning("%d job(s) were in flight at the last stop and are now failed (backend_restarted)", failed)
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
        await self.executor.shutdown()
        self.monitor.stop()
        self.store.close()

    async def _housekeeping(self) -> None:
        """Bound what grows without end: the event feed (device samples are trimmed by the monitor)."""
        while True:
            try:
                self.events.trim()
            except Exception:
                log.exception("event feed trim failed")
            await asyncio.sleep(HOUSEKEEPING_S)

    async def _sweep_idle_jobs(self) -> None:
        while True:
            await asyncio.sleep(self.settings.idle_sweep_s)
            try:
                self.completion.sweep()
            except Exception:
                log.exception("idle sweep failed")

    def _trained_to_the_end(self, job_id: str) -> bool:
        """After a restart: was this job's training over (a keep-alive cut short), so that it is done?"""
        progress = self.store.get_progress(job_id) or {}
        return progress.get("source") == states.PROGRESS_MANAGED and progress.get("phase") in (
            states.PHASE_KEEP_ALIVE, states.PHASE_FINISHED)

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
