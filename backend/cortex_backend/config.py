"""The backend's settings: one typed, explicit object with defaults that work on a laptop."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cortex_nb.protocol import wire
from cortex_nb.protocol.backend_proof import new_nonce


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "cortex-nb" / "backend"


@dataclass
class BackendSettings:
    host: str = "127.0.0.1"
    # 0 picks a free port; the chosen one is written to DATA_DIR/backend.json.
    port: int = 8765
    data_dir: Path = field(default_factory=default_data_dir)
    # Drawn at each start and written to backend.json: local clients check the listener knows it.
    endpoint_nonce: str = field(default_factory=new_nonce, repr=False)
    # Registered models: name -> local Hugging Face directory (safetensors only).
    models: dict[str, Path] = field(default_factory=dict)
    # Quantized bases (QLoRA): model name (registered, or "tiny") -> "nf4" | "int8" (docs/models.md).
    quantize: dict[str, str] = field(default_factory=dict)
    # "auto" (GPUs pynvml sees, else CPU slots), "cpu", "cpu:N", or GPU indices "0,1".
    devices: str = "auto"
    # How many sub-jobs may share one device before jobs queue.
    sub_jobs_per_device: int = 4
    # Idle worker processes kept with torch already imported, so a new sub-job starts in about a second.
    warm_workers: int = 1
    # Sub-jobs (training, sampling, log-probability) on one device and base model as adapter slots of one
    # shared worker process (adapter_host.py; True, `--adapter-host`), or one process per sub-job (False,
    # `--isolation-per-job`). None (the default): adapter hosts on GPUs, a process per sub-job on CPUs.
    adapter_host: bool | None = None
    # Adapter-host slots per hosting device, beside its `sub_jobs_per_device` processes: slots share one
    # process and one copy of the base, so memory (adapter_host_memory_bytes) bounds them more than this.
    adapter_slots_per_device: int = 64
    # CPU workers forked from one process that imported torch, transformers and peft once (fork server:
    # worker_forkserver.py), instead of each started as a process of its own ("exec"). GPU workers always start.
    worker_start: str = "fork"
    # The bytes one adapter host's base and slots may hold; a slot past it waits in the queue, one that could
    # never fit is refused (host_budget.py, room_waits.py).
    # None: on a GPU the device's free memory bounds it, on a CPU nothing does.
    adapter_host_memory_bytes: int | None = None
    # Requests of several slots of one adapter host computed in one pass, each row through its own slot's
    # adapter (slot_batching.py): "generate", "all" (forward_backward too), "off", or "auto" (generates on a
    # GPU; a CPU keeps each slot bitwise the job alone, where batching rounds differently).
    batch_across_slots: str = "auto"
    # Torch threads per CPU worker; None lets torch choose.
    worker_threads: int | None = None
    # The engine sampling sub-jobs run: "transformers" (built in), "vllm" (the extra cortex-nb[vllm]), or
    # "auto" (vLLM on GPUs where it is installed, else the built-in engine). See sampler_choice.py.
    sampler: str = "auto"
    # vLLM only: the share of a GPU's memory one vLLM sampler may take (weights and KV cache), leaving the
    # rest to the trainer and other sub-jobs on that GPU; and, on a CPU, the GiB its KV cache reserves.
    vllm_gpu_memory_fraction: float = 0.45
    vllm_cpu_kv_cache_gib: int = 1
    # vLLM on an adapter host (engine/hosted_vllm.py): its one engine per base serves every vLLM sampling slot's
    # adapter, up to this many adapters in one step, of LoRA ranks up to this one.
    vllm_max_loras: int = 8
    vllm_max_lora_rank: int = 64
    # A running job with no request for this long is completed, freeing its device (a trained adapter
    # is saved as checkpoint `final` first). Short, and shown to users as a countdown.
    idle_timeout_s: float = 300.0
    # How often idle timeouts and keep-alives are checked.
    idle_sweep_s: float = 1.0
    # Stop the backend after this many seconds with no job queued or running and no source run (the
    # per-user local backend); None: serve until stopped.
    idle_exit_s: float | None = None
    # SIGTERM drains (drain.py): training runs pause at a checkpoint, queued requests finish; after this
    # many seconds whatever still runs is stopped hard.
    drain_grace_s: float = 60.0
    max_body_bytes: int = wire.MAX_BODY_BYTES
    # HTTP: a request's header block must arrive within (and a keep-alive connection may idle for)
    # http_idle_timeout_s; its whole body within http_body_timeout_s. At most max_connections open at once.
    http_idle_timeout_s: float = 60.0
    http_body_timeout_s: float = 120.0
    max_connections: int = 1000
    # Open connections one client address may hold at once (the rest are answered 503 and closed), and the
    # seconds a new connection has to send its first request line before it is closed: slow, silent
    # connections from one place cannot take every connection the backend allows.
    max_connections_per_address: int = 500
    http_first_line_timeout_s: float = 10.0
    # A write the store refuses (disk full, database lock held by another process) is retried this long
    # before the job it is about fails with `storage_unavailable` (storage_faults.py).
    storage_retry_s: float = 30.0
    # The largest training dataset one PUT /v1/datasets/{id} may upload.
    max_dataset_bytes: int = 256 * 1024 * 1024
    # Log lines kept per job; older lines are dropped and the logs say how many.
    log_retention_lines: int = 100_000
    # checkpoints: the most bytes of checkpoints one owner may keep (None: no cap).
    checkpoint_quota_bytes: int | None = 50 * 1024**3
    # The shortest checkpoint TTL accepted (Tinker's bound, 1 hour); expired checkpoints are swept every
    # min(60 s, half of it). Tests lower it to see expiry happen.
    checkpoint_min_ttl_s: int = 3600
    # Storage that would otherwise only grow: chunks of an upload nobody used are deleted after
    # upload_ttl_s; one owner's unused chunks may take upload_quota_bytes; an Idempotency-Key is
    # remembered idempotency_ttl_s; finished jobs (without checkpoints) and runs, with their requests,
    # events and logs, are forgotten history_retention_s after they ended.
    upload_ttl_s: float = 3600.0
    # Training datasets (PUT /v1/datasets) one owner may keep.
    dataset_quota_bytes: int | None = 8 * 1024**3
    upload_quota_bytes: int = 4 * 1024**3
    # MoE routes recorded for replay (router_replays.py), held in the service's memory: the most one job keeps.
    router_replay_cache_bytes: int = 256 * 1024**2
    idempotency_ttl_s: float = 24 * 3600.0
    history_retention_s: float = 30 * 24 * 3600.0
    # Queue priorities (docs/api.md, "Priorities"): waiting this many seconds raises a holder one band
    # (0: no aging); a token without its own maximum may ask at most token_max_priority (admins: any band).
    queue_aging_s: float = 300.0
    token_max_priority: int = 9
    # Preemption (preemption.py): a training run of a priority below this pauses at a resumable checkpoint
    # and is queued again when a higher-priority job waits for its device. None: never (the default).
    preempt_below: int | None = None
    # Link speed tests (GET/POST /v1/speedtest) one token may make per minute.
    speedtest_per_minute: int = 20
    # Test-only fault injection (see faults.py): "NAME" or "NAME=SUB_JOB_ID". Empty in any real deployment.
    fault_injection: tuple[str, ...] = ()
    # Tests: a reply holding a field its schema (cortex_nb/protocol/schemas) does not declare fails (500,
    # logged) instead of losing the field, so a field added to the service without its schema is caught.
    strict_replies: bool = field(default_factory=lambda: os.environ.get("CORTEX_STRICT_REPLIES", "") == "1")

    # Tinker API face (docs/tinker.md): a session whose SDK sent no heartbeat (every 10 s) for this long has
    # ended, and its training clients are completed.
    tinker_session_timeout_s: float = 300.0
    # A Tinker training client idle this long is parked (parking.py): its state saved, its worker stopped
    # and its device slot freed until its next request brings it back. None: never.
    park_idle_s: float | None = 5.0

    # Executors (docs/scale.md) -------------------------------------------------------------------
    # "local": one worker process per sub-job on this host; "ray": one Ray actor per sub-job on the
    # hosts of a Ray cluster (pip install 'cortex-nb[ray]').
    executor: str = "local"
    # ray: the cluster to join ("HOST:PORT" of its head); None starts a Ray head here.
    ray_address: str | None = None
    # ray, when starting the head here: its port (hosts join HOST:PORT), its object store's size
    # (None: Ray's default) and a private dir (0700) for Ray's temporary files (None: a fresh one in /tmp).
    ray_port: int = 6379
    ray_object_store_bytes: int | None = None
    ray_temp_dir: Path | None = None
    # ray: the file holding Ray's authentication token (None: DATA_DIR/ray-auth-token, made for a head
    # started here); `ray_insecure` lets the backend use a `ray_address` cluster that takes anyone.
    ray_token_file: Path | None = None
    ray_insecure: bool = False
    # ray, when starting the head here: the name this host's devices go by (default: the host name);
    # `devices` "none" makes the head serve no devices of its own.
    host_name: str | None = None

    # TLS (docs/deploying.md): an operator's certificate and key, or "self-signed" to make and keep one
    # in DATA_DIR/tls. None serves plain HTTP (fine on loopback; a warning beyond it).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls: str | None = None

    # Source runs (docs/run-spec.md) ------------------------------------------------------------
    # Where runs' work dirs live; emptied at every start-up. Default: DATA_DIR/workspace.
    runs_workspace: Path | None = None
    # "auto": network, mount and PID namespaces where the host allows them; "off": never (tier none).
    run_namespaces: str = "auto"
    # Without bubblewrap source runs are refused (`sandbox_unavailable`) unless the operator says so here.
    allow_unsandboxed_runs: bool = False
    # Per-process address-space limit. None: the host's RAM for CPU runs, none for GPU runs (CUDA
    # reserves far more virtual address space than it uses).
    run_address_space_mib: int | None = None
    run_max_file_mib: int = 16 * 1024
    run_max_processes: int = 512
    # How long a stopped run's processes get between SIGTERM and SIGKILL.
    run_kill_grace_s: float = 5.0
    # Size cap of a run's private /tmp (a tmpfs: it counts against memory only as it is filled).
    run_tmp_mib: int = 1024
    # When the backend is root, each concurrent run executes as its own uid, claimed from here upwards
    # with a host-wide lock (so backends on one host never share one).
    run_uid_base: int = 1_500_000_000
    # Memory of a whole run (all its processes), enforced by a cgroup. None: 3/4 of the host's RAM.
    run_memory_mib: int | None = None
    # Bytes a run's work dir may hold (checked while it runs); 0 turns the quota off.
    run_disk_mib: int = 64 * 1024
    # CPU weight of a run against the backend's other work (cgroup cpu.weight; 100 is the default share).
    run_cpu_weight: int = 100
    # The script gate (runs/script_gate.py): "strict" refuses a run whose Python files show what the
    # policy forbids (or cannot be parsed), "warn" reports it, "off" does not look. Rules allowed anyway:
    run_script_gate: str = "warn"
    run_script_gate_allow: tuple[str, ...] = ()

    # observability --------------------------------------------------------------------------
    # Seconds between device samples (pynvml + psutil); 0 turns the monitor off.
    monitor_interval_s: float = 1.0
    # How long device samples are kept (they back GET /v1/jobs/{id}/metrics after a job ends).
    metrics_retention_s: float = 24 * 3600.0
    # Job and request state changes kept in the event feed (oldest dropped first).
    event_retention: int = 1_000_000

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        self.models = {name: Path(path).expanduser().resolve() for name, path in self.models.items()}
        if self.runs_workspace is not None:
            self.runs_workspace = Path(self.runs_workspace).expanduser().resolve()
        if self.tls_cert is not None:
            self.tls_cert = Path(self.tls_cert).expanduser().resolve()
        if self.tls_key is not None:
            self.tls_key = Path(self.tls_key).expanduser().resolve()

    @property
    def sampler_options(self) -> dict:
        """What a worker's sampling engine is told (engine/vllm_sampler.py reads it)."""
        return {
            "gpu_memory_fraction": self.vllm_gpu_memory_fraction,
            "cpu_kv_cache_gib": self.vllm_cpu_kv_cache_gib,
            "max_loras": self.vllm_max_loras,
            "max_lora_rank": self.vllm_max_lora_rank,
        }

    @property
    def db_path(self) -> Path:
        return self.data_dir / "cortex.sqlite3"

    @property
    def admin_token_path(self) -> Path:
        return self.data_dir / "admin.token"

    @property
    def endpoint_path(self) -> Path:
        """Where a started backend writes its URL and pid (how `Client.local()` finds it)."""
        return self.data_dir / "backend.json"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def user_token_path(self) -> Path:
        """A token for the OS user's own processes (kernels, the Jupyter server): not admin."""
        return self.data_dir / "user.token"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def checkpoints_dir(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def runs_dir(self) -> Path:
        """Each run's verified source archive, sandbox config and collected outputs."""
        return self.data_dir / "runs"

    @property
    def workspace_dir(self) -> Path:
        return self.runs_workspace or self.data_dir / "workspace"
