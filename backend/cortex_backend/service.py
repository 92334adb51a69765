"""The service layer: wires store, catalog, scheduler, executor, jobs, requests, logs and the
observability parts (device monitor, event feed, operator metrics, client telemetry) together.

Handlers call into `Service`; the executor reports back to it. Nothing here runs torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from .auth import ensure_admin_token
from .checkpoints import CheckpointManager
from .config import BackendSettings
from .device_metrics import DeviceMetrics
from .devices import detect_devices
from .events import EventFeed
from .executor import Executor, LocalExecutor
from .jobs import JobManager
from .logs import LogBook
from .models import ModelCatalog
from .monitor import Monitor
from .operator_metrics import LiveState, OperatorMetrics
from .requests import RequestManager
from .runs.manager import RunManager
from .samplers import assign_samplers
from .scheduler import Scheduler
from .store import Store
from .telemetry import TelemetrySink
from .uploads import UploadStore
from .weight_sync import WeightSyncCoordinator

log = logging.getLogger("cortex_backend.service")

IDLE_SWEEP_S = 15.0
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
        # observability
        self.monitor = Monitor(self.store, self.devices, settings.monitor_interval_s, settings.metrics_retention_s)
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
        failed = self.jobs.recover_after_restart()
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
            await asyncio.sleep(IDLE_SWEEP_S)
            try:
                self.jobs.sweep_idle()
            except Exception:
                log.exception("idle sweep failed")

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
