"""The device monitor: one sampler thread per backend that reads every device at a set interval.

Each tick yields one sample per device the backend serves ("cuda:N" by NVML index, or "cpu"): GPU
utilisation, memory, temperature and power from NVML (through `nvml.py`, the single init), and the
HOST's CPU and RAM from psutil (`cpu_percent`, `ram_*`: the whole machine, not one job). GPU fields
are absent, never zero, when NVML cannot answer. Samples are attributed to the sub-jobs placed on the
device at that moment, with each sub-job's own worker process measured where this host runs it
(`workers`: its CPU as a share of the host's, and its resident memory); a worker that cannot be read
is left out, never reported as zero. Samples are persisted for the job metrics endpoint, and the
latest ones are kept in memory for the live host view and /metrics.

It runs on its own thread, never on the IO loop and never near torch: a tick costs a few NVML calls,
two /proc reads and one small SQLite transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from . import nvml
from .devices import Device
from .store import Store

if TYPE_CHECKING:
    from .executors.base import DeviceSampler

log = logging.getLogger("cortex_backend.monitor")

# How often old samples are trimmed (seconds of wall time), whatever the sampling interval.
TRIM_EVERY_S = 60.0


class GpuReader:
    """NVML readings for one GPU; a field NVML refuses (NotSupported on some boards) is left out."""

    def __init__(self, lib: Any, index: int) -> None:
        self.lib = lib
        self.index = index
        self.handle = lib.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict[str, Any]:
        lib, handle, fields = self.lib, self.handle, {}
        try:
            fields["gpu_utilization_percent"] = float(lib.nvmlDeviceGetUtilizationRates(handle).gpu)
        except lib.NVMLError:
            pass
        try:
            memory = lib.nvmlDeviceGetMemoryInfo(handle)
            fields["gpu_memory_used_bytes"] = int(memory.used)
            fields["gpu_memory_total_bytes"] = int(memory.total)
        except lib.NVMLError:
            pass
        try:
            fields["gpu_temperature_c"] = float(
                lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
            )
        except lib.NVMLError:
            pass
        try:
            fields["gpu_power_watts"] = (
                lib.nvmlDeviceGetPowerUsage(handle) / 1000.0
            )  # NVML reports milliwatts
        except lib.NVMLError:
            pass
        return fields


def read_host() -> dict[str, Any]:
    """Host CPU (percent of all cores since the previous call) and RAM (used = total - available)."""
    memory = psutil.virtual_memory()
    return {
        "cpu_percent": float(psutil.cpu_percent(interval=None)),
        "ram_used_bytes": int(memory.total - memory.available),
        "ram_total_bytes": int(memory.total),
    }


class WorkerReader:
    """CPU (all its threads) and resident memory of worker processes, by pid. psutil measures a
    process's CPU since the previous reading, so a process is read twice before it reports: the first
    reading has no span, and a made-up 0 would read as an idle worker."""

    def __init__(self) -> None:
        self._processes: dict[int, psutil.Process] = {}
        self._cpus = psutil.cpu_count() or 1

    def read(self, pids: set[int]) -> dict[int, dict[str, Any]]:
        for pid in set(self._processes) - pids:
            del self._processes[pid]
        readings: dict[int, dict[str, Any]] = {}
        for pid in pids:
            process = self._processes.get(pid)
            try:
                if process is None:
                    self._processes[pid] = process = psutil.Process(pid)
                    process.cpu_percent(interval=None)  # primes the span; this tick has no reading
                    continue
                with process.oneshot():
                    cpu = process.cpu_percent(interval=None)
                    ram = process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._processes.pop(pid, None)
                continue
            # psutil counts one core as 100 %; the host figure counts all of them as 100 %.
            readings[pid] = {"cpu_percent": round(min(cpu / self._cpus, 100.0), 2), "ram_bytes": int(ram)}
        return readings


def gpu_unavailable_reason(devices: list[Device]) -> str | None:
    """Why samples carry no GPU fields (None when the backend serves GPUs NVML can read)."""
    reason = nvml.unavailable_reason()
    if reason is not None:
        return reason
    if not any(device.kind == "cuda" for device in devices):
        return "this backend serves CPU devices only (see --devices); GPU metrics are not collected"
    return None


def gpu_metrics_note(devices: list[Device], reason: str | None) -> str | None:
    """The one short line views show when there are no GPU metrics. A host without NVIDIA GPUs is
    normal, not an error: it says so quietly; GPUs NVML cannot read are a problem worth the detail."""
    if reason is None:
        return None
    if not any(device.kind == "cuda" for device in devices):
        return "CPU host: no GPU metrics"
    return f"no GPU metrics: {reason}"


# How a rank's worker reading is named in a sample's `workers`: "job/sub_job#rank1".
RANK_MARK = "#rank"


class Monitor:
    def __init__(
        self,
        store: Store | None,
        devices: list[Device],
        interval_s: float = 1.0,
        retention_s: float = 86400.0,
        worker_pid: Callable[[str, str], int | None] | None = None,
        rank_pids: Callable[[str, str], list[tuple[int, str, int]]] | None = None,
        sampler: DeviceSampler | None = None,
    ) -> None:
        self.store = store
        self.devices = devices
        self.interval_s = interval_s
        self.retention_s = retention_s
        # Readings taken on other hosts (a cluster executor's); None: this host's devices, read here.
        self.sampler = sampler
        self.gpu_unavailable_reason = (
            sampler.gpu_unavailable_reason() if sampler else gpu_unavailable_reason(devices)
        )
        self.gpu_metrics_note = gpu_metrics_note(devices, self.gpu_unavailable_reason)
        # The OS process serving a sub-job on this host (the executor's), for per-worker CPU/RAM.
        self.worker_pid = worker_pid
        # Each rank's (rank, device, pid) of a sub-job across devices: every rank is read, on its own device.
        self.rank_pids = rank_pids
        self._workers = WorkerReader()
        self.samples_taken = 0
        self.errors = 0
        self._gpus: dict[str, GpuReader] = {}
        lib = nvml.nvml()
        if lib is not None:
            for device in devices:
                if device.kind == "cuda" and device.index is not None:
                    try:
                        self._gpus[device.id] = GpuReader(lib, device.index)
                    except lib.NVMLError as exc:
                        log.warning("GPU metrics for %s are unavailable: %s", device.id, exc)
        self._latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_trim = 0.0
        read_host()  # psutil's cpu_percent measures since the previous call: prime it

    # the thread -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.gpu_unavailable_reason:
            log.info("%s (%s)", self.gpu_metrics_note, self.gpu_unavailable_reason)
        if self.interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="cortex-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bad tick must not end monitoring; log the first few
                self.errors += 1
                if self.errors <= 3:
                    log.exception("device sampling failed")
            next_tick += self.interval_s
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (a slow disk, a suspended host): skip, don't burst
                next_tick, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    # one tick -------------------------------------------------------------------------------------
    def set_devices(self, devices: list[Device]) -> None:
        """The devices served changed (hosts of a cluster joined or left)."""
        self.devices = devices
        if self.sampler is not None:
            self.gpu_unavailable_reason = self.sampler.gpu_unavailable_reason()
            self.gpu_metrics_note = gpu_metrics_note(devices, self.gpu_unavailable_reason)

    def sample(self) -> list[dict[str, Any]]:
        """One sample per device, read now (no persistence)."""
        if self.sampler is not None:
            return self.sampler.sample()
        at = time.time()
        host = read_host()
        samples = []
        for device in self.devices:
            sample: dict[str, Any] = {"at": at, "device": device.id}
            reader = self._gpus.get(device.id)
            if reader is not None:
                sample.update(reader.read())
            sample.update(host)
            samples.append(sample)
        return samples

    def tick(self) -> list[dict[str, Any]]:
        """Sample, attribute to the sub-jobs on each device, persist, and publish as the latest."""
        samples = self.sample()
        if self.store is not None:
            placed: dict[str, list[str]] = {}
            rows = self.store.active_sub_jobs()
            for row in rows:
                placed.setdefault(row["device"], []).append(f"{row['job_id']}/{row['sub_job_id']}")
            pids = self._worker_pids(rows)
            for device, name in pids:
                name = name.split(RANK_MARK)[0]
                if name not in placed.setdefault(device, []):  # a rank on a device other than rank 0's
                    placed[device].append(name)
            readings = self._workers.read(set(pids.values()))
            for sample in samples:
                sample["sub_jobs"] = placed.get(sample["device"], [])
                measured = {
                    name: readings[pid]
                    for (device, name), pid in pids.items()
                    if device == sample["device"] and pid in readings
                }
                if measured:
                    sample["workers"] = measured
        with self._lock:
            for sample in samples:
                self._latest[sample["device"]] = sample
            self.samples_taken += len(samples)
        if self.store is not None:
            # Published first: a store that refuses writes (disk full, lock held) loses the history, not the
            # live reading.
            self.store.add_device_samples(samples)
            now = time.monotonic()
            if now - self._last_trim >= TRIM_EVERY_S:
                self._last_trim = now
                self.store.trim_device_samples(time.time() - self.retention_s)
        return samples

    def _worker_pids(self, rows: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
        """(device, "job/sub_job") -> the pid of its worker there, for the workers this host runs; each rank
        of a sub-job across devices as (its device, "job/sub_job#rankN")."""
        pids: dict[tuple[str, str], int] = {}
        for row in rows:
            name = f"{row['job_id']}/{row['sub_job_id']}"
            ranks = self.rank_pids(row["job_id"], row["sub_job_id"]) if self.rank_pids else []
            for rank, device, pid in ranks:
                pids[(device, f"{name}{RANK_MARK}{rank}")] = pid
            if not ranks and self.worker_pid is not None:
                pid = self.worker_pid(row["job_id"], row["sub_job_id"])
                if pid is not None:
                    pids[(row["device"], name)] = pid
        return pids

    def latest(self) -> list[dict[str, Any]]:
        """The newest sample of each device, in device order."""
        with self._lock:
            return [dict(self._latest[device.id]) for device in self.devices if device.id in self._latest]
