"""The backend itself: its version, devices and queue, models and their tokenizers, and who a token is."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from ..backend_proof import CHALLENGE_PATTERN
from .base import Body, Query, Reply


class Version(Reply):
    """`GET /version`, the one route without authentication. Clients refuse another API major."""

    service: str
    version: str
    api_version: str
    proof: str | None = Field(
        default=None,
        description="with ?challenge=: the answer that proves this is the backend its state file names"
        " (cortex_nb/protocol/backend_proof.py); absent without a challenge",
    )


class VersionQuery(Query):
    challenge: str | None = Field(
        default=None,
        pattern=CHALLENGE_PATTERN,
        description="a fresh random hex string from a local client; the reply's `proof` answers it",
    )


class WhoAmI(Reply):
    owner: str
    token_id: str
    scopes: list[str]


class DeviceView(Reply):
    id: str = Field(description="`cpu:0`, `cuda:1`, ...")
    kind: str
    index: int | None
    name: str
    memory_bytes: int | None
    slots: int = Field(description="sub-jobs with a process of their own it serves at once")
    host: str = Field(
        default="", description="the host it is on (a node of a cluster; a local backend names its own)"
    )
    models: list[str] | None = Field(
        default=None, description="the models its host has (a cluster's); absent: every model"
    )
    sampler: str = Field(
        default="transformers",
        description="the engine its sampling sub-jobs run: `transformers` (built in) or `vllm` (docs/sampling.md)",
    )
    adapter_slots: int = Field(
        default=0,
        description="sub-jobs it serves as slots of its adapter host (one process, the base held once), beside"
        " `slots`; 0: it has no adapter host (every sub-job a process)",
    )


class DeviceCapacity(DeviceView):
    slots_in_use: int
    slots_available: int
    adapter_slots_in_use: int = 0
    adapter_slots_available: int = 0


class PendingJob(Reply):
    job_id: str
    name: str | None
    position: int
    reason: str
    estimate_s: float | None
    priority: int | None = None
    effective_priority: int | None = None


class HostCapacity(Reply):
    """A host's devices and slots, summed (a cluster has several hosts; a local backend one)."""

    host: str
    devices: list[str]
    slots_total: int
    slots_in_use: int
    slots_available: int
    adapter_slots_total: int = 0
    adapter_slots_available: int = 0
    models: list[str] | None = None


class AdapterHostView(Reply):
    """One adapter host: a worker process (on the Ray executor, an actor) holding a base model once for the
    slots (training, sampling, log-probability sub-jobs) on a device."""

    host: str | None = Field(None, description="ray: the cluster host whose actor this is")
    device: str
    base_model: str
    pid: int = Field(
        description="its process (on Ray, the actor's process on its host; 0 until Ray has placed it)"
    )
    slots: int = Field(description="sub-jobs (of any type) served by this process now")
    base_bytes: int = Field(description="the base model's weights, held once for every slot")
    slots_bytes: int = Field(
        description="what the slots add: a trainer its adapter, gradients and AdamW moments (4x the adapter);"
        " a sampler or scorer its adapter alone"
    )
    batched_operations: list[str] = Field(
        default_factory=list,
        description="the operations this host runs for several slots in one pass (`generate`,"
        " `forward_backward`; --batch-across-slots), each slot's rows through its own adapter",
    )


class ForkServerView(Reply):
    """local: the process CPU workers are forked from (it imported their libraries once); those workers
    are its children, not the backend's."""

    pid: int


class ExecutorView(Reply):
    """What runs sub-jobs: `local` worker processes, or `ray` actors on the hosts of a cluster."""

    name: str
    hosting: str | None = Field(
        None,
        description="`adapter_host` (sub-jobs on one device and base share a process, on Ray an actor,"
        " the base held once), `isolation_per_job` (a process or actor per sub-job), or `auto` (the default:"
        " adapter hosts on GPUs, a process or actor per sub-job on CPUs)",
    )
    adapter_hosts: list[AdapterHostView] | None = None
    batch_across_slots: str | None = Field(
        None,
        description="--batch-across-slots: `auto` (generates batched across an adapter host's slots on GPUs),"
        " `generate`, `all` (forward_backward too) or `off`; each host says what it batches",
    )
    fork_server: ForkServerView | None = None
    ray_address: str | None = None
    hosts: list[str] | None = None
    ray_insecure: bool | None = Field(
        None,
        description="ray: true when the cluster takes clients without Ray's token authentication (the"
        " operator's --ray-insecure): anyone who reaches its ports can run code on its hosts",
    )


class SourceRunsView(Reply):
    """Whether source runs get a sandbox here, and whether they are accepted at all without one."""

    sandbox: str = Field(description="bubblewrap, none, or unknown (still starting)")
    runs_accepted: bool = Field(description="false: POST /v1/runs answers sandbox_unavailable")
    note: str = Field(description="what a user should know, in words (says UNSANDBOXED when it is)")


class Capacity(Reply):
    devices: list[DeviceCapacity]
    slots_total: int
    slots_in_use: int
    slots_available: int
    adapter_slots_total: int = Field(
        default=0, description="adapter-host slots of every device (`DeviceView`)"
    )
    adapter_slots_in_use: int = 0
    adapter_slots_available: int = 0
    pending: int
    pending_slots: int
    hosts: list[HostCapacity] = Field(default_factory=list)
    executor: ExecutorView | None = None
    source_runs: SourceRunsView | None = None
    quantized_models: dict[str, str] = Field(
        default_factory=dict, description="the base models held quantized here, by name: nf4 or int8"
    )
    pending_jobs: list[PendingJob] = Field(description="the caller's own pending jobs, in queue order")


class ModelView(Reply):
    name: str
    kind: str = Field(description="builtin or local")
    architecture: str | None
    vocab_size: int
    max_positions: int | None
    hidden_size: int | None
    num_layers: int | None
    quantization: str | None = Field(
        None, description="how the base's weights are held: null (the device's precision), nf4 or int8"
    )


class ModelList(Reply):
    models: list[ModelView]


# Tokenizing is bounded: a read-only token could otherwise hold a core for seconds.
MAX_TEXTS = 1024
MAX_TEXT_CHARS = 1 << 20
MAX_TOKEN_IDS = 1 << 20


class TokenizeBody(Body):
    texts: list[str] = Field(description=f"at most {MAX_TEXTS} texts and {MAX_TEXT_CHARS} characters in all")
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _bounded(self) -> TokenizeBody:
        if len(self.texts) > MAX_TEXTS or sum(map(len, self.texts)) > MAX_TEXT_CHARS:
            raise PydanticCustomError(
                "invalid_field",
                "texts: at most {texts} texts and {chars} characters in all per request; split the work",
                {"texts": MAX_TEXTS, "chars": MAX_TEXT_CHARS},
            )
        return self


class Tokenized(Reply):
    model: str
    tokens: list[list[int]]
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    vocab_size: int


class DetokenizeBody(Body):
    tokens: list[list[int]] = Field(
        description=f"at most {MAX_TEXTS} lists and {MAX_TOKEN_IDS} ids in all; each id in"
        " [0, the model's vocab_size)"
    )

    @model_validator(mode="after")
    def _bounded(self) -> DetokenizeBody:
        if len(self.tokens) > MAX_TEXTS or sum(map(len, self.tokens)) > MAX_TOKEN_IDS:
            raise PydanticCustomError(
                "invalid_field",
                "tokens: at most {lists} lists and {ids} ids in all per request",
                {"lists": MAX_TEXTS, "ids": MAX_TOKEN_IDS},
            )
        return self


class Detokenized(Reply):
    model: str
    texts: list[str]
