"""Which executor a backend runs: the one its settings name. Apart from the executor interface so the
interface imports none of its implementations (Ray is imported only when it is the one chosen)."""

from __future__ import annotations

from ..config import BackendSettings
from ..devices import detect_devices
from ..sampler_choice import assign_samplers
from .base import Executor, ExecutorListener, WorkerSettings
from .local import LocalExecutor


def create_executor(settings: BackendSettings, listener: ExecutorListener) -> Executor:
    """The executor `settings.executor` names; Ray is imported only when it is the one chosen."""
    if settings.executor == "ray":
        from .ray_cluster.executor import RayExecutor

        return RayExecutor(listener, settings)
    devices = assign_samplers(
        detect_devices(settings.devices, settings.sub_jobs_per_device), settings.sampler
    )
    return LocalExecutor(
        listener,
        devices,
        settings.warm_workers,
        WorkerSettings.from_backend(settings),
        adapter_host=settings.adapter_host,
        adapter_slots_per_device=settings.adapter_slots_per_device,
        fork_workers=settings.worker_start == "fork",
    )
