"""Executors run sub-jobs. The service talks only to the `Executor` interface; `LocalExecutor` runs one
worker process per sub-job on this host, `ray_cluster.RayExecutor` one Ray actor per sub-job on the
hosts of a Ray cluster. Both run the same worker code (worker.py) and report through `report_message`.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import ipc
from .config import BackendSettings
from .devices import Device, detect_devices
from .models import ModelInfo
from .samplers import assign_samplers

log = logging.getLogger("cortex_backend.executor")

# Variables a worker must never inherit: credentials and the backend's own configuration.
SCRUBBED_ENV_PREFIXES = (
    "CORTEX_",
    "JUPYTER",
    "JPY_",
    "AWS_",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "GITHUB_TOKEN",
)


class ExecutorListener(Protocol):
    """What the executor reports back to the service (always on the IO loop)."""

    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None: ...

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None: ...

    def request_started(self, job_id: str, request_id: str) -> None: ...

    def request_finished(
        self, job_id: str, request_id: str, message: dict[str, Any], blob: bytes
    ) -> None: ...

    def log_lines(
        self, job_id: str, sub_job_id: str, stream: str, lines: list[tuple[float, str]]
    ) -> None: ...

    def sync_message(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        """A weight-sync message from a sub-job's worker, for another sub-job of the same job."""

    def loop_message(self, job_id: str, sub_job_id: str, header: dict[str, Any]) -> None:
        """A managed training loop's report (`type: loop`: started, step, eval, samples, checkpoint, ended)."""

    def devices_changed(self, devices: list[Device], host_models: dict[str, ModelInfo]) -> None:
        """Hosts joined or left (executors whose devices change): the devices now served, and the models
        registered on those hosts."""


@dataclass
class SubJobAssignment:
    job_id: str
    sub_job_id: str
    sub_job_type: str
    spec: dict[str, Any]
    model: ModelInfo
    device: Device


class Executor(abc.ABC):
    def __init__(self, listener: ExecutorListener) -> None:
        self.listener = listener

    async def start(self) -> None:
        """Prepare (e.g. warm workers). Called once when the service starts."""

    @abc.abstractmethod
    async def start_sub_job(self, assignment: SubJobAssignment) -> None:
        """Start serving a sub-job; report `sub_job_ready` or `sub_job_failed`."""

    @abc.abstractmethod
    def submit(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> None:
        """Queue a request behind the sub-job's earlier ones (held until the sub-job is ready)."""

    @abc.abstractmethod
    def cancel_request(self, job_id: str, sub_job_id: str, request_id: str) -> None:
        """Ask the sub-job to drop or interrupt a request."""

    @abc.abstractmethod
    async def stop_sub_job(self, job_id: str, sub_job_id: str) -> None:
        """Stop a sub-job and free its device. Stopping is expected: it is not reported as a crash."""

    async def shutdown(self) -> None:
        """Stop everything (service exit)."""

    def deliver(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        """Hand a message to a running sub-job at once, outside its request queue (weight-sync messages)."""
        raise NotImplementedError(f"{type(self).__name__} does not relay weight-sync messages")

    def worker_pid(self, job_id: str, sub_job_id: str) -> int | None:
        """The OS process serving a sub-job, where there is one on this host."""
        return None

    # devices ----------------------------------------------------------------------------------
    def current_devices(self) -> list[Device]:
        """The devices sub-jobs may be placed on now (they may change later: `devices_changed`)."""
        return []

    def device_sampler(self) -> DeviceSampler | None:
        """Where device samples come from when the devices are not this host's (None: the monitor reads
        this host's devices itself)."""
        return None

    # Source runs execute in a sandbox on the backend's own host, so only on an executor whose devices
    # are this host's.
    runs_on_this_host: bool = True

    def describe(self) -> dict[str, Any]:
        """What users are shown about the executor (GET /v1/capacity, backend.json)."""
        return {"name": "local"}


class DeviceSampler(Protocol):
    """Device readings taken elsewhere (on each host of a cluster), one sample dict per device."""

    def sample(self) -> list[dict[str, Any]]: ...

    def gpu_unavailable_reason(self) -> str | None: ...


def report_message(
    listener: ExecutorListener, assignment: SubJobAssignment, header: dict[str, Any], blob: bytes
) -> bool:
    """Hand a worker's message about its sub-job to the service; False for a kind the executor handles
    itself (warm, ready). One place, so every executor reports the same messages the same way."""
    kind = header.get("type")
    job_id, sub_job_id = assignment.job_id, assignment.sub_job_id
    if kind == "init_failed":
        listener.sub_job_failed(job_id, sub_job_id, header["code"], header["message"])
    elif kind == "started":
        listener.request_started(job_id, header["request_id"])
    elif kind == "finished":
        listener.request_finished(job_id, header["request_id"], header, blob)
    elif kind == "sync":
        listener.sync_message(job_id, sub_job_id, header, blob)
    elif kind == "loop":
        listener.loop_message(job_id, sub_job_id, header)
    else:
        return False
    return True


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
        settings.worker_threads,
        faults=settings.fault_injection,
        sampler_options=settings.sampler_options,
    )


# A blob larger than this is written to its worker a slice at a time (WorkerProcess.send).
STREAMED_BLOB_BYTES = 1 << 20
STREAM_SLICE_BYTES = 1 << 20


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    device_id: str
    warm: asyncio.Event = field(default_factory=asyncio.Event)
    assignment: SubJobAssignment | None = None
    stopping: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)
    ready: asyncio.Future | None = None
    early_output: list[tuple[str, float, str]] = field(default_factory=list)
    # Messages waiting behind a large blob that is being written a slice at a time.
    outbox: collections.deque = field(default_factory=collections.deque)
    sender: asyncio.Task | None = None

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        """Messages reach the worker in the order sent. A large blob is written in slices with the IO loop
        free in between: written at once, a 256 MiB frame is copied into the transport's buffer in one go
        and every other client waits for that copy."""
        if self.writer.is_closing():
            return
        # Written at once only when nothing is being streamed: a large blob already taken off the outbox may be
        # half written, and a message written now would land inside it.
        streaming = self.sender is not None and not self.sender.done()
        if len(blob) <= STREAMED_BLOB_BYTES and not self.outbox and not streaming:
            self.writer.write(ipc.pack(header, blob))
            return
        self.outbox.append((header, blob))
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._send_outbox())

    async def _send_outbox(self) -> None:
        try:
            while self.outbox:
                header, blob = self.outbox.popleft()
                if self.writer.is_closing():
                    return
                self.writer.write(ipc.pack_header(header, len(blob)))
                view = memoryview(blob)
                for start in range(0, len(view), STREAM_SLICE_BYTES):
                    self.writer.write(view[start : start + STREAM_SLICE_BYTES])
                    await self.writer.drain()
        except (ConnectionError, RuntimeError):
            self.outbox.clear()  # the worker is gone; its end is reported by the reader


# Settings every worker runs with, whichever executor starts it.
WORKER_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # Library deprecation notices are not the user's to act on; they drown the job's own lines.
    "PYTHONWARNINGS": "ignore::FutureWarning",
}
# Sleeping, not spinning, between parallel regions: several CPU workers (and anything else) share
# the cores, and spinning OpenMP threads make a loaded host ten times slower (bench_core measures it).
WORKER_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def scrubbed_environment() -> dict[str, str]:
    """This process's environment without credentials or the backend's own configuration."""
    return {key: value for key, value in os.environ.items() if not key.startswith(SCRUBBED_ENV_PREFIXES)}


def worker_environment(device: Device) -> dict[str, str]:
    env = scrubbed_environment()
    env.update(WORKER_ENV)
    for key, value in WORKER_ENV_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(device.worker_env())
    return env


class LocalExecutor(Executor):
    """One worker process per sub-job on this host, plus warm spares per device."""

    def __init__(
        self,
        listener: ExecutorListener,
        devices: list[Device],
        warm_workers: int = 1,
        worker_threads: int | None = None,
        faults: tuple[str, ...] = (),
        sampler_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(listener)
        self.devices = {device.id: device for device in devices}
        self.warm_workers = warm_workers
        self.worker_threads = worker_threads
        # Test-only fault injection (faults.py), passed to every worker.
        self.faults = tuple(faults)
        # How a worker's sampling engine is set up (BackendSettings.sampler_options); the engine itself
        # is the device's (Device.sampler).
        self.sampler_options = dict(sampler_options or {})
        self._spares: dict[str, list[WorkerProcess]] = defaultdict(list)
        self._workers: dict[tuple[str, str], WorkerProcess] = {}
        self._backlog: dict[tuple[str, str], list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        self._closed = False

    async def start(self) -> None:
        for device_id in self.devices:
            for _ in range(self.warm_workers):
                self._spares[device_id].append(await self._spawn(self.devices[device_id]))

    def current_devices(self) -> list[Device]:
        return list(self.devices.values())

    async def _spawn(self, device: Device) -> WorkerProcess:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cortex_backend.worker",
                "--fd",
                str(child_sock.fileno()),
                pass_fds=(child_sock.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=worker_environment(device),
                start_new_session=True,
            )
        finally:
            child_sock.close()
        reader, writer = await asyncio.open_connection(sock=parent_sock, limit=2**30)
        worker = WorkerProcess(process, reader, writer, device.id)
        worker.tasks = [
            asyncio.create_task(self._read_messages(worker)),
            asyncio.create_task(self._read_stream(worker, process.stdout, "stdout")),
            asyncio.create_task(self._read_stream(worker, process.stderr, "stderr")),
        ]
        return worker

    async def _take_worker(self, device: Device) -> WorkerProcess:
        spares = self._spares[device.id]
        while spares:
            worker = spares.pop(0)
            if worker.process.returncode is None:
                break
        else:
            worker = await self._spawn(device)
        if not self._closed and self.warm_workers > 0:
            asyncio.create_task(self._replenish(device))
        return worker

    async def _replenish(self, device: Device) -> None:
        if len(self._spares[device.id]) < self.warm_workers and not self._closed:
            self._spares[device.id].append(await self._spawn(device))

    async def start_sub_job(self, assignment: SubJobAssignment) -> None:
        key = (assignment.job_id, assignment.sub_job_id)
        worker = await self._take_worker(assignment.device)
        worker.assignment = assignment
        worker.ready = asyncio.get_running_loop().create_future()
        self._workers[key] = worker
        for stream, at, line in worker.early_output:
            self.listener.log_lines(assignment.job_id, assignment.sub_job_id, stream, [(at, line)])
        worker.early_output.clear()
        worker.send(
            {
                "type": "init",
                "job_id": assignment.job_id,
                "sub_job_id": assignment.sub_job_id,
                "sub_job_type": assignment.sub_job_type,
                "spec": assignment.spec,
                "model": assignment.model.to_wire(),
                "env": assignment.device.worker_env(),
                "threads": self.worker_threads,
                "faults": list(self.faults),
                "sampler": assignment.device.sampler,
                "sampler_options": self.sampler_options,
            }
        )

    def submit(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> None:
        header = {"type": "request", "request_id": request_id, "op": op, "params": params}
        worker = self._workers.get((job_id, sub_job_id))
        if worker is None or worker.ready is None or not worker.ready.done():
            self._backlog[(job_id, sub_job_id)].append((header, blob))
            return
        worker.send(header, blob)

    def cancel_request(self, job_id: str, sub_job_id: str, request_id: str) -> None:
        backlog = self._backlog.get((job_id, sub_job_id), [])
        self._backlog[(job_id, sub_job_id)] = [
            item for item in backlog if item[0]["request_id"] != request_id
        ]
        worker = self._workers.get((job_id, sub_job_id))
        if worker is not None:
            worker.send({"type": "cancel", "request_id": request_id})

    def worker_pid(self, job_id: str, sub_job_id: str) -> int | None:
        worker = self._workers.get((job_id, sub_job_id))
        return worker.process.pid if worker else None

    def deliver(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        worker = self._workers.get((job_id, sub_job_id))
        if worker is not None:
            worker.send(header, blob)

    async def stop_sub_job(self, job_id: str, sub_job_id: str) -> None:
        self._backlog.pop((job_id, sub_job_id), None)
        worker = self._workers.pop((job_id, sub_job_id), None)
        if worker is not None:
            await self._stop(worker)

    async def _stop(self, worker: WorkerProcess, grace_s: float = 3.0) -> None:
        worker.stopping = True
        worker.send({"type": "shutdown"})
        with contextlib.suppress(Exception):
            worker.writer.close()
        try:
            await asyncio.wait_for(worker.process.wait(), grace_s)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            await worker.process.wait()

    async def shutdown(self) -> None:
        self._closed = True
        workers = list(self._workers.values()) + [w for spares in self._spares.values() for w in spares]
        self._workers.clear()
        self._spares.clear()
        await asyncio.gather(*(self._stop(worker, grace_s=2.0) for worker in workers), return_exceptions=True)

    # reading from a worker -----------------------------------------------------------------------
    async def _read_messages(self, worker: WorkerProcess) -> None:
        try:
            while True:
                header, blob = await ipc.read_message(worker.reader)
                self._on_message(worker, header, blob)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        returncode = await worker.process.wait()
        # Let its last stdout/stderr lines (a crash's traceback) reach the logs before the exit is reported.
        readers = [task for task in worker.tasks if task is not asyncio.current_task()]
        if readers:
            await asyncio.wait(readers, timeout=2.0)
        self._on_exit(worker, returncode)

    def _on_message(self, worker: WorkerProcess, header: dict[str, Any], blob: bytes) -> None:
        kind = header.get("type")
        assignment = worker.assignment
        if kind == "warm":
            worker.warm.set()
            return
        if assignment is None:
            return
        if kind == "ready":
            worker.ready.set_result(True)
            self.listener.sub_job_ready(assignment.job_id, assignment.sub_job_id, header.get("info") or {})
            for queued_header, queued_blob in self._backlog.pop(
                (assignment.job_id, assignment.sub_job_id), []
            ):
                worker.send(queued_header, queued_blob)
            return
        if kind == "init_failed":
            worker.stopping = True
        report_message(self.listener, assignment, header, blob)

    def _on_exit(self, worker: WorkerProcess, returncode: int) -> None:
        assignment = worker.assignment
        for spares in self._spares.values():
            if worker in spares:
                spares.remove(worker)
        if assignment is None or worker.stopping:
            return
        self._workers.pop((assignment.job_id, assignment.sub_job_id), None)
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        self.listener.sub_job_failed(
            assignment.job_id,
            assignment.sub_job_id,
            "worker_crashed",
            f"the worker serving {assignment.sub_job_id} died ({how}); see the job's logs. Other jobs are unaffected.",
        )

    async def _read_stream(self, worker: WorkerProcess, stream: asyncio.StreamReader, name: str) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the stream limit: take what is there
                raw = await stream.read(2**16)
            if not raw:
                return
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            at = time.time()
            assignment = worker.assignment
            if assignment is None:
                worker.early_output.append((name, at, line))
                del worker.early_output[:-200]
            else:
                self.listener.log_lines(assignment.job_id, assignment.sub_job_id, name, [(at, line)])
