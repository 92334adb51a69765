"""Executors run sub-jobs. The service talks only to the `Executor` interface; `LocalExecutor` runs one
worker process per sub-job on this host. (A Ray executor would implement the same five methods.)
"""

from __future__ import annotations

import abc
import asyncio
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
from .devices import Device
from .models import ModelInfo

log = logging.getLogger("cortex_backend.executor")

# Variables a worker must never inherit: credentials and the backend's own configuration.
SCRUBBED_ENV_PREFIXES = ("CORTEX_", "JUPYTER", "JPY_", "AWS_", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN")


class ExecutorListener(Protocol):
    """What the executor reports back to the service (always on the IO loop)."""

    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None: ...

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None: ...

    def request_started(self, job_id: str, request_id: str) -> None: ...

    def request_finished(self, job_id: str, request_id: str, message: dict[str, Any], blob: bytes) -> None: ...

    def log_lines(self, job_id: str, sub_job_id: str, stream: str, lines: list[tuple[float, str]]) -> None: ...

    def sync_message(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        """A weight-sync message from a sub-job's worker, for another sub-job of the same job."""

    def loop_message(self, job_id: str, sub_job_id: str, header: dict[str, Any]) -> None:
        """A managed training loop's report (`type: loop`: started, step, eval, samples, checkpoint, ended)."""


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
    def submit(self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes) -> None:
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

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        if not self.writer.is_closing():
            self.writer.write(ipc.pack(header, blob))


def worker_environment(device: Device) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(SCRUBBED_ENV_PREFIXES)}
    env.update(
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        # Library deprecation notices are not the user's to act on; they drown the job's own lines.
        PYTHONWARNINGS="ignore::FutureWarning",
    )
    # Sleeping, not spinning, between parallel regions: several CPU workers (and anything else) share
    # the cores, and spinning OpenMP threads make a loaded host ten times slower (bench_core measures it).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update(device.worker_env())
    return env


class LocalExecutor(Executor):
    """One worker process per sub-job on this host, plus warm spares per device."""

    def __init__(self, listener: ExecutorListener, devices: list[Device], warm_workers: int = 1, worker_threads: int | None = None,
                 faults: tuple[str, ...] = (), sampler_options: dict[str, Any] | None = None) -> None:
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

    async def _spawn(self, device: Device) -> WorkerProcess:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cortex_backend.worker", "--fd", str(child_sock.fileno()),
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

    def submit(self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes) -> None:
        header = {"type": "request", "request_id": request_id, "op": op, "params": params}
        worker = self._workers.get((job_id, sub_job_id))
        if worker is None or worker.ready is None or not worker.ready.done():
            self._backlog[(job_id, sub_job_id)].append((header, blob))
            return
        worker.send(header, blob)

    def cancel_request(self, job_id: str, sub_job_id: str, request_id: str) -> None:
        backlog = self._backlog.get((job_id, sub_job_id), [])
        self._backlog[(job_id, sub_job_id)] = [item for item in backlog if item[0]["request_id"] != request_id]
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
            for queued_header, queued_blob in self._backlog.pop((assignment.job_id, assignment.sub_job_id), []):
                worker.send(queued_header, queued_blob)
        elif kind == "init_failed":
            worker.stopping = True
            self.listener.sub_job_failed(assignment.job_id, assignment.sub_job_id, header["code"], header["message"])
        elif kind == "started":
            self.listener.request_started(assignment.job_id, header["request_id"])
        elif kind == "finished":
            self.listener.request_finished(assignment.job_id, header["request_id"], header, blob)
        elif kind == "sync":
            self.listener.sync_message(assignment.job_id, assignment.sub_job_id, header, blob)
        elif kind == "loop":
            self.listener.loop_message(assignment.job_id, assignment.sub_job_id, header)

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
