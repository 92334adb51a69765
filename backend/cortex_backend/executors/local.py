"""The local executor: worker processes on this host, warm spares per device.

A training sub-job with `n_gpus` > 1 is a rank group: one worker process per rank, each on its own
device, in a process group of their own (MASTER_ADDR=127.0.0.1, a free port, RANK, WORLD_SIZE). Every
rank receives the same requests; only rank 0's replies reach the service; each rank's log lines are
tagged `[rank N]`; one rank's exit fails the sub-job (`worker_crashed`) and stops the others.

With `adapter_host` a sub-job (training, sampling or log-probability) becomes a slot of the adapter host
of its (device, base model): one process holding the base weights once (adapter_host.py). With
`isolation_per_job` every sub-job gets a process of its own, as do sub-jobs whose base or engine a host
cannot share. By default (`auto`) sub-jobs on GPUs are slots and sub-jobs on CPUs get a process each: on a
GPU processes time-share the device anyway and each would hold its own copy of the base in device memory;
on a CPU processes compute side by side on the cores, where one host computes one slot at a time.
"""

from __future__ import annotations

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
from typing import Any

from .. import ipc
from .. import worker_messages as messages
from ..devices import Device
from ..slot_batching import batched_operations
from ..slot_logs import addressed_slots
from .base import (
    Executor,
    ExecutorListener,
    Hosting,
    SubJobAssignment,
    WorkerSettings,
    init_message,
    report_message,
    slot_key,
)
from .environment import worker_environment
from .forkserver import ForkedProcess, ForkServer
from .rank_groups import RankGroupState, free_port, rank_inits, shared_gpu_refusal

log = logging.getLogger("cortex_backend.executors.base")


# A blob larger than this is written to its worker a slice at a time (WorkerProcess.send).
STREAMED_BLOB_BYTES = 1 << 20
STREAM_SLICE_BYTES = 1 << 20


# The environment of the fork server: a CPU worker's, which sees no GPU.
CPU_FORK_DEVICE = Device(id="cpu", kind="cpu", index=None, name="cpu", memory_bytes=None, slots=1)


@dataclass
class Slot:
    """A sub-job served by an adapter host."""

    assignment: SubJobAssignment
    ready: asyncio.Future
    released: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    # What the slot adds to its host (adapter, gradients, optimizer moments), as it reported when ready.
    slot_bytes: int = 0


@dataclass
class RankGroup(RankGroupState):
    """The worker processes of one sub-job across devices (engine/sharding.py), rank 0 first."""

    workers: list[WorkerProcess] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return self.ready_info([(worker.process.pid, worker.device_id) for worker in self.workers])


@dataclass
class WorkerProcess:
    process: asyncio.subprocess.Process | ForkedProcess
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    device_id: str
    warm: asyncio.Event = field(default_factory=asyncio.Event)
    assignment: SubJobAssignment | None = None
    stopping: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)
    ready: asyncio.Future | None = None
    early_output: list[tuple[str, float, str]] = field(default_factory=list)
    # An adapter host's sub-jobs by slot (`slot_key`; empty for a worker of one sub-job).
    slots: dict[str, Slot] = field(default_factory=dict)
    host_key: tuple[str, str] | None = None
    # An adapter host's base weights, as its slots report them.
    base_bytes: int = 0
    # Messages waiting behind a large blob that is being written a slice at a time.
    outbox: collections.deque = field(default_factory=collections.deque)
    sender: asyncio.Task | None = None
    # A rank of a sub-job across devices (RankGroup), and which.
    group: RankGroup | None = None
    rank: int = 0

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


class LocalExecutor(Executor):
    """Worker processes on this host, plus warm spares per device; with `adapter_host`, one shared process
    per (device, base model) for its sub-jobs (adapter_host.py)."""

    def __init__(
        self,
        listener: ExecutorListener,
        devices: list[Device],
        warm_workers: int = 1,
        worker_settings: WorkerSettings | None = None,
        adapter_host: bool | None = None,
        fork_workers: bool = True,
        adapter_slots_per_device: int = 64,
    ) -> None:
        super().__init__(listener)
        self.hosting = Hosting(adapter_host)
        devices = self.hosting.with_adapter_slots(devices, adapter_slots_per_device)
        self.devices = {device.id: device for device in devices}
        self.warm_workers = warm_workers
        self.worker_settings = worker_settings or WorkerSettings()
        self._spares: dict[str, list[WorkerProcess]] = defaultdict(list)
        # sub-job -> the process serving it (an adapter host serves several)
        self._workers: dict[tuple[str, str], WorkerProcess] = {}
        # (device id, base model) -> its adapter host
        self._hosts: dict[tuple[str, str], WorkerProcess] = {}
        self._host_starts: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._backlog: dict[tuple[str, str], list[tuple[dict[str, Any], bytes]]] = defaultdict(list)
        # Sub-jobs whose worker is being taken or spawned (set once it is assigned).
        self._starting: dict[tuple[str, str], asyncio.Event] = {}
        self._closed = False
        # CPU workers forked from a process that imported their libraries once (forkserver.py).
        self._forkserver = (
            ForkServer(worker_environment(CPU_FORK_DEVICE))
            if fork_workers and any(device.kind == "cpu" for device in devices)
            else None
        )

    async def start(self) -> None:
        for device_id in self.devices:
            for _ in range(self.warm_workers):
                self._spares[device_id].append(await self._spawn(self.devices[device_id]))

    def current_devices(self) -> list[Device]:
        return list(self.devices.values())

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": "local",
            "hosting": self.hosting.word,
        }
        if self.hosting.adapter_host is not False:
            described["batch_across_slots"] = self.worker_settings.batch_across_slots
        if self._forkserver is not None and self._forkserver.usable and self._forkserver.pid:
            # CPU workers are forks of this process, not children of the backend.
            described["fork_server"] = {"pid": self._forkserver.pid}
        if self.hosting.adapter_host is not False:
            described["adapter_hosts"] = [
                {
                    "device": device_id,
                    "base_model": base_model,
                    "pid": host.process.pid,
                    "slots": len(host.slots),
                    "base_bytes": host.base_bytes,
                    "slots_bytes": sum(slot.slot_bytes for slot in host.slots.values()),
                    "batched_operations": sorted(
                        batched_operations(
                            self.worker_settings.batch_across_slots, self.devices[device_id].kind == "cuda"
                        )
                    ),
                }
                for (device_id, base_model), host in sorted(self._hosts.items())
            ]
        return described

    def hosts_on(self, device: Device) -> bool:
        return self.hosting.on(device)

    async def _spawn(self, device: Device) -> WorkerProcess:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = await self._forked(device, child_sock) or await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cortex_backend.worker_process",
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

    async def _forked(self, device: Device, channel: socket.socket) -> ForkedProcess | None:
        """A CPU worker forked from the fork server; None where a process must be started (a GPU worker: the
        CUDA driver does not survive a fork), or the fork server is gone."""
        server = self._forkserver
        if server is None or device.kind != "cpu" or not await server.ensure_started():
            return None
        try:
            return await server.fork(worker_environment(device), channel)
        except OSError:
            return None

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

    async def _take_host(self, assignment: SubJobAssignment) -> WorkerProcess:
        """The adapter host of the sub-job's device and base, started from a warm worker if there is none.
        One start at a time per (device, base): a job's sub-jobs start together, and each would otherwise
        start a host of its own."""
        key = (assignment.device.id, assignment.model.name)
        async with self._host_starts[key]:
            host = self._hosts.get(key)
            if host is not None and host.process.returncode is None and not host.stopping:
                return host
            host = await self._take_worker(assignment.device)
            host.host_key = key
            host.send(
                messages.encode(
                    messages.HostAdapters(
                        assignment.device.worker_env(),
                        self.worker_settings.threads,
                        self.worker_settings.adapter_host_memory_bytes,
                        self.worker_settings.batch_across_slots,
                    )
                )
            )
            self._hosts[key] = host
            return host

    async def start_sub_job(self, assignment: SubJobAssignment) -> None:
        if assignment.rank_group:
            await self._start_rank_group(assignment)
            return
        if assignment.tensor_parallel and not self._distinct_gpus(assignment):
            return
        key = (assignment.job_id, assignment.sub_job_id)
        starting = self._starting[key] = asyncio.Event()
        hosted = self.hosting.hosts(assignment)
        try:
            worker = await (self._take_host(assignment) if hosted else self._take_worker(assignment.device))
        finally:
            del self._starting[key]
            starting.set()
        self._workers[key] = worker
        init = messages.encode(init_message(assignment, self.worker_settings))
        ready = asyncio.get_running_loop().create_future()
        if hosted:
            worker.slots[slot_key(assignment.job_id, assignment.sub_job_id)] = Slot(assignment, ready)
            self._send_to(worker, assignment.job_id, assignment.sub_job_id, init)
            return
        worker.assignment = assignment
        worker.ready = ready
        for stream, at, line in worker.early_output:
            self.listener.log_lines(assignment.job_id, assignment.sub_job_id, stream, [(at, line)])
        worker.early_output.clear()
        worker.send(init)

    async def _start_rank_group(self, assignment: SubJobAssignment) -> None:
        """One worker per rank (warm ones where there are), each told its rank and the group's rendezvous."""
        key = (assignment.job_id, assignment.sub_job_id)
        devices = assignment.rank_devices
        if not self._distinct_gpus(assignment):
            return
        starting = self._starting[key] = asyncio.Event()
        try:
            workers = [await self._take_worker(device) for device in devices]
        finally:
            del self._starting[key]
            starting.set()
        group = RankGroup(assignment, workers=workers)
        self._workers[key] = workers[0]
        inits = rank_inits(init_message(assignment, self.worker_settings), devices, "127.0.0.1", free_port())
        for rank, (worker, init) in enumerate(zip(workers, inits, strict=True)):
            worker.group, worker.rank = group, rank
            worker.assignment = assignment
            worker.ready = asyncio.get_running_loop().create_future()
            for stream, at, line in worker.early_output:
                self._log(assignment, stream, at, f"[rank {rank}] {line}")
            worker.early_output.clear()
            worker.send(messages.encode(init))

    def _distinct_gpus(self, assignment: SubJobAssignment) -> bool:
        """A sub-job across GPUs needs each on a GPU of its own; otherwise it fails here, saying so."""
        refusal = shared_gpu_refusal(assignment.rank_devices)
        if refusal is not None:
            self.listener.sub_job_failed(
                assignment.job_id, assignment.sub_job_id, "worker_start_failed", refusal
            )
        return refusal is None

    def _send_to(
        self, worker: WorkerProcess, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes = b""
    ) -> None:
        """Send to the worker of a sub-job: addressed to its slot when the worker is an adapter host, to
        every rank when it is a rank group."""
        if worker.group is not None:
            for rank_worker in worker.group.workers:
                rank_worker.send(header, blob)
            return
        if worker.host_key is not None:
            header = {**header, messages.SLOT_KEY: slot_key(job_id, sub_job_id)}
        worker.send(header, blob)

    def _is_ready(self, worker: WorkerProcess, job_id: str, sub_job_id: str) -> bool:
        slot = worker.slots.get(slot_key(job_id, sub_job_id))
        ready = slot.ready if slot is not None else worker.ready
        return ready is not None and ready.done()

    def submit(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> None:
        header = messages.encode(messages.Request(request_id, op, params))
        worker = self._workers.get((job_id, sub_job_id))
        if worker is None or not self._is_ready(worker, job_id, sub_job_id):
            self._backlog[(job_id, sub_job_id)].append((header, blob))
            return
        self._send_to(worker, job_id, sub_job_id, header, blob)

    def cancel_request(self, job_id: str, sub_job_id: str, request_id: str) -> None:
        backlog = self._backlog.get((job_id, sub_job_id), [])
        self._backlog[(job_id, sub_job_id)] = [
            item for item in backlog if item[0]["request_id"] != request_id
        ]
        worker = self._workers.get((job_id, sub_job_id))
        if worker is not None:
            self._send_to(worker, job_id, sub_job_id, messages.encode(messages.Cancel(request_id)))

    def worker_pid(self, job_id: str, sub_job_id: str) -> int | None:
        worker = self._workers.get((job_id, sub_job_id))
        return worker.process.pid if worker else None

    def rank_pids(self, job_id: str, sub_job_id: str) -> list[tuple[int, str, int]]:
        worker = self._workers.get((job_id, sub_job_id))
        if worker is None or worker.group is None:
            return []
        return [(rank, each.device_id, each.process.pid) for rank, each in enumerate(worker.group.workers)]

    def deliver(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        worker = self._workers.get((job_id, sub_job_id))
        if worker is not None:
            self._send_to(worker, job_id, sub_job_id, header, blob)

    async def stop_sub_job(self, job_id: str, sub_job_id: str) -> None:
        starting = self._starting.get((job_id, sub_job_id))
        if starting is not None:  # stopped while its worker was being started: stop that worker once it is
            await starting.wait()
        self._backlog.pop((job_id, sub_job_id), None)
        worker = self._workers.pop((job_id, sub_job_id), None)
        if worker is None:
            return
        if worker.group is not None:
            for rank_worker in worker.group.workers:
                rank_worker.stopping = True
            await asyncio.gather(*(self._stop(rank_worker) for rank_worker in worker.group.workers))
            return
        if worker.host_key is None:
            await self._stop(worker)
            return
        slot = worker.slots.get(slot_key(job_id, sub_job_id))
        if slot is not None:
            await self._release(worker, slot)

    async def _release(self, host: WorkerProcess, slot: Slot, grace_s: float = 3.0) -> None:
        """Stop a slot: its managed loop ends its step and saves within `grace_s`, as a process of its own
        would; the host stops with its last slot (so its memory goes back with it)."""
        slot.stopping = True
        job_id, sub_job_id = slot.assignment.job_id, slot.assignment.sub_job_id
        self._send_to(host, job_id, sub_job_id, messages.encode(messages.Shutdown()))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(slot.released.wait(), grace_s)
        host.slots.pop(slot_key(job_id, sub_job_id), None)
        if not host.slots and self._hosts.get(host.host_key) is host:
            del self._hosts[host.host_key]
            await self._stop(host)

    async def _stop(self, worker: WorkerProcess, grace_s: float = 3.0) -> None:
        """Ask the worker to stop and give it `grace_s` to finish its own way out (a managed loop ends
        its step and saves); the channel stays open meanwhile, so what it still reports lands instead
        of breaking its pipe. Past the grace it is killed."""
        worker.stopping = True
        worker.send(messages.encode(messages.Shutdown()))
        try:
            await asyncio.wait_for(worker.process.wait(), grace_s)
        except asyncio.TimeoutError:
            pass
        try:
            # Whatever the worker started goes with it (its own session): the device is free once this returns.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            await worker.process.wait()
        finally:
            with contextlib.suppress(Exception):
                worker.writer.close()

    async def shutdown(self) -> None:
        self._closed = True
        # An adapter host serves several sub-jobs: each process once (by identity; the records are not hashable).
        found = [*self._workers.values(), *self._hosts.values()]
        found += [worker for spares in self._spares.values() for worker in spares]
        workers = list({id(worker): worker for worker in found}.values())
        self._workers.clear()
        self._spares.clear()
        self._hosts.clear()
        await asyncio.gather(*(self._stop(worker, grace_s=2.0) for worker in workers), return_exceptions=True)
        if self._forkserver is not None:
            await self._forkserver.close()

    # reading from a worker -----------------------------------------------------------------------
    async def _read_messages(self, worker: WorkerProcess) -> None:
        try:
            while True:
                header, blob = await ipc.read_message(worker.reader)
                try:
                    self._on_message(worker, header, blob)
                except Exception:  # one message handled badly must not stop the reading of the rest
                    log.exception("a message from the worker of %s was not handled", worker.assignment)
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
        if kind == messages.Warm.kind:
            worker.warm.set()
            return
        slot_id = messages.slot_of(header)
        if slot_id is not None:
            slot = worker.slots.get(slot_id)
            if slot is not None:
                self._on_assigned_message(worker, slot.assignment, slot.ready, header, blob, slot)
            return
        if worker.group is not None:
            self._on_rank_message(worker, header, blob)
            return
        if worker.assignment is not None:
            self._on_assigned_message(worker, worker.assignment, worker.ready, header, blob, None)

    def _on_rank_message(self, worker: WorkerProcess, header: dict[str, Any], blob: bytes) -> None:
        """A rank group is ready once every rank is; rank 0 speaks for the sub-job, the others' replies
        (the same results) are dropped, but a failed start of any rank fails it."""
        group = worker.group
        kind = header.get("type")
        if kind == messages.InitFailed.kind:
            if group.end():
                for rank_worker in group.workers:
                    rank_worker.stopping = True
                report_message(self.listener, group.assignment, group.failed_start(worker.rank, header), blob)
            return
        if kind == messages.Ready.kind:
            if not group.rank_ready(worker.rank, header.get("info")):
                return
            for rank_worker in group.workers:
                if not rank_worker.ready.done():
                    rank_worker.ready.set_result(True)
            assignment = group.assignment
            self.listener.sub_job_ready(assignment.job_id, assignment.sub_job_id, group.describe())
            key = (assignment.job_id, assignment.sub_job_id)
            for queued_header, queued_blob in self._backlog.pop(key, []):
                self._send_to(
                    group.workers[0], assignment.job_id, assignment.sub_job_id, queued_header, queued_blob
                )
            return
        if worker.rank == 0:
            report_message(self.listener, group.assignment, header, blob)

    def _on_assigned_message(
        self,
        worker: WorkerProcess,
        assignment: SubJobAssignment,
        ready: asyncio.Future,
        header: dict[str, Any],
        blob: bytes,
        slot: Slot | None,
    ) -> None:
        kind = header.get("type")
        key = (assignment.job_id, assignment.sub_job_id)
        if kind == messages.Released.kind:
            if slot is not None:
                slot.released.set()
            return
        if kind == messages.Ready.kind:
            if not ready.done():
                ready.set_result(True)
            info = header.get("info") or {}
            if slot is not None:
                slot.slot_bytes = int(info.get("slot_bytes") or 0)
                worker.base_bytes = int((info.get("adapter_host") or {}).get("base_bytes") or 0)
            self.listener.sub_job_ready(assignment.job_id, assignment.sub_job_id, header.get("info") or {})
            for queued_header, queued_blob in self._backlog.pop(key, []):
                self._send_to(worker, assignment.job_id, assignment.sub_job_id, queued_header, queued_blob)
            return
        if kind == messages.InitFailed.kind:
            if slot is not None:
                slot.stopping = True
            else:
                worker.stopping = True
        report_message(
            self.listener, assignment, {k: v for k, v in header.items() if k != messages.SLOT_KEY}, blob
        )

    def _on_exit(self, worker: WorkerProcess, returncode: int) -> None:
        for spares in self._spares.values():
            if worker in spares:
                spares.remove(worker)
        how = f"signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        if worker.group is not None:
            self._on_rank_exit(worker, how)
            return
        if worker.host_key is not None:
            if self._hosts.get(worker.host_key) is worker:
                del self._hosts[worker.host_key]
            # A crash of the host fails every slot it served; each can be resumed from its checkpoints.
            served = len(worker.slots)
            for slot_id, slot in list(worker.slots.items()):
                worker.slots.pop(slot_id, None)
                sub_job_id = slot.assignment.sub_job_id
                key = (slot.assignment.job_id, sub_job_id)
                if self._workers.get(key) is worker:
                    del self._workers[key]
                if slot.stopping or worker.stopping:
                    continue
                self.listener.sub_job_failed(
                    slot.assignment.job_id,
                    sub_job_id,
                    "worker_crashed",
                    f"the adapter host serving {sub_job_id} died ({how}), failing its {served}"
                    " slot(s); see the job's logs. Jobs on other processes are unaffected.",
                )
            return
        assignment = worker.assignment
        if assignment is None or worker.stopping:
            return
        self._workers.pop((assignment.job_id, assignment.sub_job_id), None)
        self.listener.sub_job_failed(
            assignment.job_id,
            assignment.sub_job_id,
            "worker_crashed",
            f"the worker serving {assignment.sub_job_id} died ({how}); see the job's logs. Other jobs are unaffected.",
        )

    def _on_rank_exit(self, worker: WorkerProcess, how: str) -> None:
        """One rank gone fails the whole sub-job: the others would wait in their next collective. The
        service's stop of the failed sub-job (`stop_sub_job`) then stops every rank and frees their slots."""
        group = worker.group
        if group.ended or worker.stopping:
            return
        group.end()
        assignment = group.assignment
        self.listener.sub_job_failed(
            assignment.job_id,
            assignment.sub_job_id,
            "worker_crashed",
            group.crash_message(worker.rank, worker.process.pid, how),
        )

    def _log(self, assignment: SubJobAssignment, name: str, at: float, line: str) -> None:
        try:
            self.listener.log_lines(assignment.job_id, assignment.sub_job_id, name, [(at, line)])
        except (
            Exception
        ):  # the stream is read to its end whatever a line meets: a full pipe stalls the worker
            log.exception("a %s line of %s's worker was not recorded", name, assignment.sub_job_id)

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
            if worker.host_key is not None:
                # An adapter host tags each slot's lines; its own lines concern every slot.
                slot_ids, line = addressed_slots(worker.slots, line)
                for slot_id in slot_ids:
                    self._log(worker.slots[slot_id].assignment, name, at, line)
                continue
            assignment = worker.assignment
            if assignment is None:
                worker.early_output.append((name, at, line))
                del worker.early_output[:-200]
                continue
            if worker.group is not None:  # a rank's lines, merged with the others' as they come
                line = f"[rank {worker.rank}] {line}"
            self._log(assignment, name, at, line)
