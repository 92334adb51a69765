"""Executors run sub-jobs. The service talks only to the `Executor` interface (here); `LocalExecutor`
(local.py) runs worker processes on this host, `ray_cluster.executor.RayExecutor` one Ray actor per sub-job on
the hosts of a Ray cluster; choice.py picks one, environment.py says what a worker's environment holds,
rank_groups.py keeps the books of a sub-job across devices for both. Both run the same worker code
(worker.py), speak the same messages (worker_messages.py), start a sub-job with the same `init_message`
and report through `report_message`.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from cortex_nb.protocol import states
from cortex_nb.protocol.states import SAMPLING

from .. import worker_messages as messages
from ..config import BackendSettings
from ..devices import Device, devices_env
from ..models import ModelInfo


class ExecutorStartRefused(Exception):
    """The executor will not start as configured (an unsafe cluster, a missing credential); the message
    says why and what to do."""


class ExecutorListener(Protocol):
    """What the executor reports back to the service (always on the IO loop)."""

    def sub_job_ready(self, job_id: str, sub_job_id: str, info: dict[str, Any]) -> None: ...

    def sub_job_failed(self, job_id: str, sub_job_id: str, code: str, message: str) -> None: ...

    def sub_job_waits_for_room(self, job_id: str, sub_job_id: str, reason: str) -> None:
        """An adapter host's slot did not fit in memory now but would once another slot of its device ends:
        the job goes back to the queue with `reason` (the bytes) instead of failing."""

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

    def request_tokens(self, job_id: str, request_id: str, samples: list[dict[str, Any]]) -> None:
        """A streamed generate's newly decoded tokens (`type: tokens`), before its `finished`."""

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
    # A sub-job across devices (`n_gpus` > 1): every rank's device, rank 0's first; empty for one device.
    rank_devices: tuple[Device, ...] = ()

    @property
    def tensor_parallel(self) -> bool:
        """A sampling sub-job across devices: one worker whose vLLM engine spans them (not a rank group)."""
        return bool(self.rank_devices) and self.sub_job_type == SAMPLING

    @property
    def rank_group(self) -> bool:
        """A training sub-job across devices: one worker per rank (engine/sharding.py)."""
        return bool(self.rank_devices) and not self.tensor_parallel


def slot_key(job_id: str, sub_job_id: str) -> str:
    """How an adapter host names a sub-job's slot (sub-job ids repeat across jobs: `training-0`)."""
    return f"{job_id}/{sub_job_id}"


@dataclass(frozen=True)
class Hosting:
    """Which sub-jobs become slots of an adapter host (adapter_host.py), for every executor alike.

    `adapter_host`: True for every device (`--adapter-host`), False for none (`--isolation-per-job`), None
    (auto) for GPUs only: on a GPU processes time-share the device and each holds its own copy of the
    base in device memory; on a CPU processes compute side by side, where one host computes one slot at a
    time.
    """

    adapter_host: bool | None = None

    @property
    def word(self) -> str:
        """How GET /v1/capacity names the choice."""
        return {True: "adapter_host", False: "isolation_per_job", None: "auto"}[self.adapter_host]

    def on(self, device: Device) -> bool:
        """Whether sub-jobs on `device` may be adapter-host slots."""
        return self.adapter_host if self.adapter_host is not None else device.kind == "cuda"

    def hosts_on(self, device: Device) -> bool:
        """Whether `device` has an adapter host for single-device sub-jobs on an unquantized base (on a
        device sampling with vLLM too: its sampling slots share one vLLM engine, engine/hosted_vllm.py)."""
        return self.on(device)

    def with_adapter_slots(self, devices: list[Device], per_device: int) -> list[Device]:
        """`devices` with the adapter-host slots each serves beside its process slots (the scheduler's second
        pool: slots share a process and a base, so many more fit; memory bounds them, host_budget.py)."""
        return [
            dataclasses.replace(device, adapter_slots=per_device if self.hosts_on(device) else 0)
            for device in devices
        ]

    def hosts(self, assignment: SubJobAssignment) -> bool:
        """Whether a sub-job becomes a slot: any type (a hosted built-in sampler runs its adapter unmerged over
        the shared base; a hosted vLLM sampler's adapter is a LoRA of the host's vLLM engine), on a base in
        the device's own precision (a quantized base keeps a process of its own; a sub-job across devices,
        a tensor-parallel vLLM sampler too, has its own ranks)."""
        return (
            self.hosts_on(assignment.device)
            and not assignment.rank_devices
            and assignment.sub_job_type in states.SUB_JOB_TYPES
            and not assignment.model.quantization
        )


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

    def drain(self, job_id: str, sub_job_id: str) -> None:
        """Tell a sub-job's worker the backend is draining: its managed loop stops after the step in hand
        and saves a resumable checkpoint (drain.py)."""
        self.deliver(job_id, sub_job_id, messages.encode(messages.Drain()), b"")

    def deliver(self, job_id: str, sub_job_id: str, header: dict[str, Any], blob: bytes) -> None:
        """Hand a message to a running sub-job at once, outside its request queue (weight-sync messages)."""
        raise NotImplementedError(f"{type(self).__name__} does not relay weight-sync messages")

    def worker_pid(self, job_id: str, sub_job_id: str) -> int | None:
        """The OS process serving a sub-job, where there is one on this host."""
        return None

    def rank_pids(self, job_id: str, sub_job_id: str) -> list[tuple[int, str, int]]:
        """(rank, device, pid) of each rank of a sub-job across devices on this host; empty for any other."""
        return []

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
    itself (warm, ready). One place, so every executor reports the same messages the same way.
    Raises `worker_messages.UnknownMessage` for a header that is no message."""
    message = messages.decode(header)
    job_id, sub_job_id = assignment.job_id, assignment.sub_job_id
    if isinstance(message, messages.InitFailed) and message.waits_for_room:
        listener.sub_job_waits_for_room(job_id, sub_job_id, message.message)
    elif isinstance(message, messages.InitFailed):
        listener.sub_job_failed(job_id, sub_job_id, message.code, message.message)
    elif isinstance(message, messages.Started):
        listener.request_started(job_id, message.request_id)
    elif isinstance(message, messages.Finished):
        listener.request_finished(job_id, message.request_id, messages.encode(message), blob)
    elif isinstance(message, messages.Sync):
        listener.sync_message(job_id, sub_job_id, messages.encode(message), blob)
    elif isinstance(message, messages.Loop):
        listener.loop_message(job_id, sub_job_id, messages.encode(message))
    elif isinstance(message, messages.Tokens):
        listener.request_tokens(job_id, message.request_id, message.samples)
    else:
        return False
    return True


def init_message(
    assignment: SubJobAssignment,
    settings: WorkerSettings,
    model: ModelInfo | None = None,
) -> messages.Init:
    """The `init` that assigns a worker (or an adapter host's slot) its sub-job, for every executor.
    `model`: the model as the worker's host sees it, where that differs (a cluster host's own directory).
    A tensor-parallel sampler's worker sees all its devices and sizes its engine to them."""
    sampler_options = dict(settings.sampler_options)
    env = assignment.device.worker_env()
    if assignment.tensor_parallel:
        sampler_options["tensor_parallel_size"] = len(assignment.rank_devices)
        env = devices_env(assignment.rank_devices)
    return messages.Init(
        job_id=assignment.job_id,
        sub_job_id=assignment.sub_job_id,
        sub_job_type=assignment.sub_job_type,
        spec=assignment.spec,
        model=(model or assignment.model).to_wire(),
        # The GPU the scheduler chose (every GPU of a tensor-parallel sampler); a CPU sub-job sees none.
        env=env,
        threads=settings.threads,
        faults=list(settings.faults),
        sampler=assignment.device.sampler,
        sampler_options=sampler_options,
    )


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker of a backend is started with (BackendSettings' worker options)."""

    threads: int | None = None
    # Test-only fault injection (faults.py), passed to every worker.
    faults: tuple[str, ...] = ()
    # How a worker's sampling engine is set up; the engine itself is the device's (Device.sampler).
    sampler_options: dict[str, Any] = field(default_factory=dict)
    # Adapter hosts only: the bytes a host's base and slots may hold (host_budget.py).
    adapter_host_memory_bytes: int | None = None
    # Adapter hosts only: whether slots' generates share decoding passes (slot_batching.py).
    batch_across_slots: str = "auto"

    @classmethod
    def from_backend(cls, settings: BackendSettings) -> WorkerSettings:
        return cls(
            settings.worker_threads,
            tuple(settings.fault_injection),
            dict(settings.sampler_options or {}),
            settings.adapter_host_memory_bytes,
            settings.batch_across_slots,
        )
