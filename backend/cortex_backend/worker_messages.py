"""Every message between the service and a worker, typed once.

On the wire a message is a JSON header (its `type` names the kind) plus an optional binary blob (ipc.py).
Each kind here is a frozen dataclass; `encode` turns one into its header and `decode` turns a header back,
refusing a kind not listed. Both executors (local processes, Ray actors) and the worker speak only these.

Messages to and from an adapter host (adapter_host.py) carry the slot they concern in the header's `slot`
key: the envelope, not the message, so every kind can be addressed to a slot unchanged.

Frozen dataclasses, encoded to dicts that ipc.py turns into JSON. Measured (bench/bench_worker_messages.py,
one `request` encoded and one `finished` decoded): untyped dicts 0.57x, pydantic models 0.47x (their JSON
is pydantic-core's, not the standard library's), msgspec structs 0.03x of this; in absolute terms the
typing adds about 6 us a request, under 1 % of a no-op round trip (bench/bench_contract.py). Kept for
now: no dependency, and the fields are already checked where the service built them (the HTTP schemas).
If IPC ever shows in a profile, msgspec structs behind the same `encode`/`decode` are the step to take.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cortex_nb.protocol import states


class UnknownMessage(ValueError):
    """A header whose `type` is no message kind: a bug on the sending side, never to be ignored silently."""


@dataclass(frozen=True)
class Message:
    kind: ClassVar[str] = ""


# worker → service: life cycle --------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello(Message):
    """The process is up (before the heavy imports)."""

    kind: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True)
class Warm(Message):
    """torch, transformers and peft are imported: an assignment starts fast."""

    kind: ClassVar[str] = "warm"


@dataclass(frozen=True)
class Ready(Message):
    """The sub-job (or slot) is loaded; `info` is what users are shown about it."""

    kind: ClassVar[str] = "ready"
    info: dict[str, Any]


@dataclass(frozen=True)
class InitFailed(Message):
    kind: ClassVar[str] = "init_failed"
    code: str
    message: str
    # An adapter host's slot that did not fit in memory now but would once another slot ends: its job
    # goes back to the queue instead of failing (host_budget.py).
    waits_for_room: bool = False


# worker → service: requests ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Started(Message):
    kind: ClassVar[str] = "started"
    request_id: str
    at: float


@dataclass(frozen=True)
class Finished(Message):
    """A request ended: `status` is one of the request states a worker reports (FINISHED_STATUSES)."""

    kind: ClassVar[str] = "finished"
    request_id: str
    status: str
    result: dict[str, Any] | None = None
    code: str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        if self.status not in FINISHED_STATUSES:
            raise UnknownMessage(
                f"a finished request's status is one of {sorted(FINISHED_STATUSES)}, not {self.status!r}"
            )


FINISHED_STATUSES = frozenset({states.REQUEST_SUCCEEDED, states.REQUEST_FAILED, states.REQUEST_CANCELLED})


def succeeded(request_id: str, result: dict[str, Any]) -> Finished:
    return Finished(request_id, states.REQUEST_SUCCEEDED, result=result)


def failed(request_id: str, code: str, message: str) -> Finished:
    status = states.REQUEST_CANCELLED if code == "cancelled" else states.REQUEST_FAILED
    return Finished(request_id, status, code=code, message=message)


@dataclass(frozen=True)
class Loop(Message):
    """A managed training loop's report (`event`: started, step, eval, samples, checkpoint, ended, ...)."""

    kind: ClassVar[str] = "loop"
    request_id: str
    event: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tokens(Message):
    """A streamed generate's newly decoded tokens, per sample, before its `finished`."""

    kind: ClassVar[str] = "tokens"
    request_id: str
    samples: list[dict[str, Any]]


# both ways ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sync(Message):
    """A weight-sync message between a source and a target sub-job, relayed by the service (`to`)."""

    kind: ClassVar[str] = "sync"
    request_id: str
    to: str
    sync_kind: str
    fields: dict[str, Any] = field(default_factory=dict)


# service → worker --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Init(Message):
    """Assign a warm worker (or an adapter host's new slot) its sub-job. Built by `init_message` only."""

    kind: ClassVar[str] = "init"
    job_id: str
    sub_job_id: str
    sub_job_type: str
    spec: dict[str, Any]
    model: dict[str, Any]
    env: dict[str, str]
    threads: int | None
    faults: list[str]
    sampler: str
    sampler_options: dict[str, Any]


@dataclass(frozen=True)
class Request(Message):
    kind: ClassVar[str] = "request"
    request_id: str
    op: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cancel(Message):
    kind: ClassVar[str] = "cancel"
    request_id: str


@dataclass(frozen=True)
class Drain(Message):
    """The backend is draining: a managed loop stops after its step and saves (drain.py)."""

    kind: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Shutdown(Message):
    """Stop the worker (or, addressed to a slot, release that slot of an adapter host)."""

    kind: ClassVar[str] = "shutdown"


@dataclass(frozen=True)
class HostAdapters(Message):
    """Make this warm worker an adapter host: it then takes any number of `init`s, one per slot."""

    kind: ClassVar[str] = "host_adapters"
    env: dict[str, str]
    threads: int | None
    # --adapter-host-memory: the bytes the base and its slots may hold (None: no budget; host_budget.py)
    memory_budget_bytes: int | None = None
    # --batch-across-slots: "auto", "off", "generate" or "all" (adapter_host.batched_operations)
    batch_across_slots: str = "auto"


@dataclass(frozen=True)
class Released(Message):
    """An adapter host's slot has stopped (after `shutdown` addressed to it): its memory is free."""

    kind: ClassVar[str] = "released"


# Ray actor → service (the actor relays the worker's output and its end) ----------------------------------
@dataclass(frozen=True)
class Log(Message):
    kind: ClassVar[str] = "log"
    stream: str
    lines: list[Any]


@dataclass(frozen=True)
class WorkerExited(Message):
    kind: ClassVar[str] = "worker_exited"
    reason: str


KINDS: dict[str, type[Message]] = {
    cls.kind: cls
    for cls in (
        Hello,
        Warm,
        Ready,
        InitFailed,
        Started,
        Finished,
        Loop,
        Tokens,
        Sync,
        Init,
        Request,
        Cancel,
        Drain,
        Shutdown,
        HostAdapters,
        Released,
        Log,
        WorkerExited,
    )
}
SLOT_KEY = "slot"


def encode(message: Message, slot: str | None = None) -> dict[str, Any]:
    """The header that carries `message` (addressed to an adapter host's `slot`, if given)."""
    if isinstance(message, Sync):
        header = {**message.fields, "type": "sync", "request_id": message.request_id, "to": message.to}
        header["kind"] = message.sync_kind
    elif isinstance(message, Loop):
        header = {**message.event, "type": "loop", "request_id": message.request_id}
    else:
        header = {"type": message.kind}
        for item in dataclasses.fields(message):
            value = getattr(message, item.name)
            if value is not None or not isinstance(message, Finished):
                header[item.name] = value
    if slot is not None:
        header[SLOT_KEY] = slot
    return header


def decode(header: dict[str, Any]) -> Message:
    """The message a header carries; UnknownMessage for a kind not listed in KINDS."""
    kind = header.get("type")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownMessage(f"no worker message kind {kind!r}; the kinds are {sorted(KINDS)}")
    rest = {key: value for key, value in header.items() if key not in ("type", SLOT_KEY)}
    if cls is Sync:
        return Sync(rest.pop("request_id"), rest.pop("to"), rest.pop("kind"), rest)
    if cls is Loop:
        return Loop(rest.pop("request_id"), rest)
    try:
        return cls(**rest)
    except TypeError as exc:
        raise UnknownMessage(f"a {kind!r} message with fields {sorted(rest)}: {exc}") from None


def slot_of(header: dict[str, Any]) -> str | None:
    return header.get(SLOT_KEY)
