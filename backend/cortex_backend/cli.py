"""`cortex-nb backend ...`: serve, and manage tokens; `cortex-nb host join` (a host joins a Ray cluster)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cortex_nb.protocol.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from cortex_nb.protocol.quantization import QUANTIZATIONS
from cortex_nb.protocol.routes import SCOPES

from .config import BackendSettings, default_data_dir
from .runs.script_gate import GATE_MODES, RULES
from .sampler_choice import SAMPLER_SETTINGS, check_sampler_setting


def _model_option(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("use NAME=DIR, e.g. --model llama-1b=/models/llama-1b")
    return name, path


def _quantize_option(value: str) -> tuple[str | None, str]:
    """NAME=KIND quantizes one model; a bare KIND every model registered with --model."""
    name, sep, kind = value.rpartition("=")
    if kind not in QUANTIZATIONS or (sep and not name):
        raise argparse.ArgumentTypeError(
            f"use NAME=KIND or KIND with KIND one of {', '.join(QUANTIZATIONS)}, e.g. --quantize llama-8b=nf4"
        )
    return (name or None), kind


def check_quantization_backend(quantize: dict[str, str]) -> None:
    """A quantized base needs torchao (any device) or bitsandbytes (CUDA); say which extra brings them."""
    import importlib.util

    if quantize and not any(importlib.util.find_spec(name) for name in ("torchao", "bitsandbytes")):
        raise ValueError(
            "--quantize needs torchao (or bitsandbytes on CUDA): pip install 'cortex-nb[quantize]'"
        )


def quantize_map(options: list[tuple[str | None, str]], models: dict[str, str]) -> dict[str, str]:
    quantize: dict[str, str] = {}
    for name, kind in options:
        for target in [name] if name else list(models):
            quantize[target] = kind
    return quantize


def _at_least(low: float, kind: type = float):
    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a{'n integer' if kind is int else ' number'}: {value!r}"
            ) from None
        if number < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}")
        return number

    return parse


def _priority_cap(value: str) -> int:
    """A token's priority cap: at least the default band (anyone may ask the default), at most the top."""
    number = _at_least(DEFAULT_PRIORITY, int)(value)
    if number > MAX_PRIORITY:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PRIORITY}, got {value}")
    return number


def _preempt_band(value: str) -> int:
    """`--preempt-below N`: runs of priority < N may be preempted; 1 (only band 0) to 10 (every band)."""
    number = _at_least(MIN_PRIORITY + 1, int)(value)
    if number > MAX_PRIORITY + 1:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PRIORITY + 1}, got {value}")
    return number


def _fraction(value: str) -> float:
    number = _at_least(0.0)(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return number


def _byte_count(value: str) -> int:
    units = {
        "": 1,
        "K": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "KI": 2**10,
        "MI": 2**20,
        "GI": 2**30,
        "TI": 2**40,
    }
    text = value.strip().upper().removesuffix("B")
    number = text.rstrip("KMGTI")
    unit = text[len(number) :]
    if not number.isdigit() or unit not in units:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a byte count; use e.g. 1000000, 500M, 50G or 8GiB"
        )
    return int(number) * units[unit]


def _fault_option(value: str) -> str:
    from .faults import parse_fault

    try:
        return parse_fault(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_backend_commands(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="backend_command", required=True)
    serve = commands.add_parser("serve", help="run the backend service")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument(
        "--port",
        type=int,
        default=8765,
        help="port (default %(default)s; 0 picks a free one; see DATA_DIR/backend.json)",
    )
    http = serve.add_argument_group("HTTP limits (docs/security.md)")
    http.add_argument(
        "--http-idle-timeout",
        type=_at_least(1.0),
        default=60.0,
        metavar="SECONDS",
        help="a request's headers must arrive within this, and an idle keep-alive connection closes after it"
        " (default 60)",
    )
    http.add_argument(
        "--http-body-timeout",
        type=_at_least(1.0),
        default=120.0,
        metavar="SECONDS",
        help="a request's whole body must arrive within this, or the connection is closed (default 120)",
    )
    http.add_argument(
        "--max-connections",
        type=_at_least(16, int),
        default=1000,
        help="open connections at most (also at most half the open-files limit); more are answered 503"
        " too_many_connections and closed (default 1000)",
    )
    http.add_argument(
        "--max-connections-per-address",
        type=_at_least(1, int),
        default=500,
        help="open connections one client address may hold (more are answered 503 too_many_connections and"
        " closed; default 500)",
    )
    http.add_argument(
        "--http-first-line-timeout",
        type=_at_least(0.5),
        default=10.0,
        metavar="SECONDS",
        help="a new connection that has not sent its request line within this is closed (default 10)",
    )
    serve.add_argument(
        "--storage-retry",
        type=_at_least(0.1),
        default=30.0,
        metavar="SECONDS",
        help="how long a write the store refuses (disk full, database lock held) is retried before the job it"
        " is about fails with storage_unavailable (default 30)",
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help="where the store, tokens and checkpoints live",
    )
    serve.add_argument(
        "--model",
        action="append",
        type=_model_option,
        default=[],
        metavar="NAME=DIR",
        help="register a local Hugging Face model directory (safetensors only); repeatable",
    )
    serve.add_argument(
        "--quantize",
        action="append",
        type=_quantize_option,
        default=[],
        metavar="[NAME=]nf4|int8",
        help="hold a model's base weights quantized (QLoRA: nf4 = 4-bit NormalFloat, int8); NAME is a --model"
        " name or tiny, and a bare KIND applies to every --model; the adapters stay full precision; repeatable",
    )
    serve.add_argument(
        "--devices",
        default="auto",
        help="'auto', 'cpu', 'cpu:N' (N slots) or GPU indices like '0,1'; with --executor ray also 'none'"
        " (the head serves no devices of its own)",
    )
    queue = serve.add_argument_group("queue priorities (docs/api.md)")
    queue.add_argument(
        "--queue-aging-s",
        type=_at_least(0.0),
        default=300.0,
        help="seconds of waiting that raise a queued job or run one priority band (0: no aging; default 300)",
    )
    queue.add_argument(
        "--token-max-priority",
        type=_priority_cap,
        default=9,
        help="the highest priority (5-9) a token without its own --max-priority may ask; admins may ask any"
        " (default 9)",
    )
    queue.add_argument(
        "--preempt-below",
        type=_preempt_band,
        default=None,
        help="let a waiting job take the device of a training run of a lower priority below this band"
        " (1-10): the run pauses at a resumable checkpoint and is queued again, losing no step (default: off)",
    )
    serve.add_argument(
        "--speedtest-per-minute",
        type=_at_least(1, int),
        default=20,
        help="link speed test calls (GET/POST /v1/speedtest) one token may make per minute (default 20)",
    )
    serve.add_argument(
        "--sub-jobs-per-device",
        type=int,
        default=4,
        help="sub-jobs with a process of their own sharing one device before jobs queue (default 4)",
    )
    serve.add_argument(
        "--adapter-slots-per-device",
        type=_at_least(0, int),
        default=64,
        help="with adapter hosts: sub-jobs one device serves as slots of its adapter host, beside the processes"
        " above (default 64; memory bounds them first: --adapter-host-memory; 0: slots count as processes)",
    )
    serve.add_argument(
        "--warm-workers", type=int, default=1, help="idle pre-started worker processes per device"
    )
    serve.add_argument("--worker-threads", type=int, default=None, help="torch threads per CPU worker")
    hosting = serve.add_mutually_exclusive_group()
    hosting.add_argument(
        "--adapter-host",
        dest="adapter_host",
        action="store_true",
        default=None,
        help="sub-jobs on one device and base model share one worker process that holds the base weights"
        " once, each an adapter slot; samplers there run their LoRA unmerged (docs/api.md). Without this"
        " option or the next: adapter hosts on GPUs, a process per sub-job on CPUs",
    )
    hosting.add_argument(
        "--isolation-per-job",
        dest="adapter_host",
        action="store_false",
        help="every sub-job in a worker process of its own, on every device",
    )
    serve.add_argument(
        "--worker-start",
        choices=("fork", "exec"),
        default="fork",
        help="how CPU workers start: forked from one process that imported torch, transformers and peft once"
        " (the default: in milliseconds, the libraries' pages shared), or each a new process (about nine"
        " seconds of CPU each); GPU workers always start as new processes",
    )
    serve.add_argument(
        "--adapter-host-memory",
        dest="adapter_host_memory_bytes",
        type=_byte_count,
        default=None,
        metavar="BYTES",
        help="with adapter hosts (the default on GPUs): the bytes one host's base and slots may hold (e.g. 40GiB); a slot that"
        " would pass it waits in the queue until a slot of that host ends, one that could never fit fails with"
        " adapter_host_full (default: a GPU's free memory, unbounded on a CPU)",
    )
    serve.add_argument(
        "--batch-across-slots",
        choices=("auto", "off", "generate", "all"),
        default="auto",
        help="with adapter hosts: requests of several slots of one host computed in one pass, each row"
        " through its own slot's adapter: 'generate' (generates), 'all' (forward_backward too), 'off', or"
        " 'auto' (the default: generates on GPUs, nothing on CPUs, which keep each slot's numerics bitwise"
        " those of the job alone; batched, they agree to float rounding)",
    )
    serve.add_argument(
        "--sampler",
        choices=SAMPLER_SETTINGS,
        default="auto",
        help="engine of sampling sub-jobs: 'transformers' (built in), 'vllm' (pip install 'cortex-nb[vllm]'),"
        " or 'auto' (vLLM on GPUs where it is installed, else transformers; the default)",
    )
    serve.add_argument(
        "--vllm-gpu-memory-fraction",
        type=_fraction,
        default=0.45,
        metavar="FRACTION",
        help="share of a GPU's memory one vLLM sampler may take, weights and KV cache (default 0.45)",
    )
    serve.add_argument(
        "--vllm-cpu-kv-cache-gib",
        type=_at_least(1, int),
        default=1,
        metavar="GIB",
        help="KV cache a vLLM sampler reserves on a CPU-only host (default 1)",
    )
    serve.add_argument(
        "--vllm-max-loras",
        type=_at_least(1, int),
        default=8,
        metavar="N",
        help="with adapter hosts: adapters the host's shared vLLM engine decodes in one step (default 8)",
    )
    serve.add_argument(
        "--vllm-max-lora-rank",
        type=_at_least(1, int),
        default=64,
        metavar="R",
        help="with adapter hosts: the largest LoRA rank the shared vLLM engine serves; a sampling slot of a"
        " larger rank samples with the built-in engine (default 64)",
    )
    serve.add_argument(
        "--idle-timeout",
        type=_at_least(1.0),
        default=300.0,
        help="seconds a running job may have nothing to do before it is completed, freeing its device"
        " (trained steps are saved as checkpoint 'final' first)",
    )
    serve.add_argument(
        "--idle-exit",
        type=_at_least(1.0),
        default=None,
        metavar="SECONDS",
        help="stop the backend after this long with no job queued or running and no source run"
        " (the per-user local backend uses 1800); default: never",
    )
    serve.add_argument(
        "--drain-grace",
        type=_at_least(0.0),
        default=60.0,
        metavar="SECONDS",
        help="on SIGTERM, how long to drain: training runs pause at a resumable checkpoint and queued"
        " requests finish; then whatever still runs is stopped hard (default 60)",
    )
    serve.add_argument(
        "--checkpoint-quota-bytes",
        type=_byte_count,
        default=50 * 1024**3,
        metavar="BYTES",
        help="most bytes of checkpoints one token owner may keep (e.g. 50000000000 or 50G; 0: no cap;"
        " default 50GiB)",
    )
    serve.add_argument(
        "--checkpoint-min-ttl",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="shortest TTL a checkpoint may be given (default 3600, Tinker's bound); expired checkpoints are"
        " deleted unless in use",
    )
    storage = serve.add_argument_group("storage bounds (docs/security.md)")
    storage.add_argument(
        "--upload-ttl",
        type=_at_least(1.0),
        default=3600.0,
        metavar="SECONDS",
        help="chunks of an upload no request used are deleted after this (default 3600)",
    )
    storage.add_argument(
        "--router-replay-cache-bytes",
        type=_byte_count,
        default=256 * 1024**2,
        metavar="BYTES",
        help="MoE routes recorded for router replay that one job may keep in the backend's memory (default"
        " 256MiB); a generate whose routes would pass it fails with router_replay_cache_full",
    )
    storage.add_argument(
        "--upload-quota-bytes",
        type=_byte_count,
        default=4 * 1024**3,
        metavar="BYTES",
        help="unused upload chunks one token owner may hold at once (default 4GiB); more are refused"
        " with quota_exceeded",
    )
    storage.add_argument(
        "--dataset-quota-bytes",
        type=_byte_count,
        default=8 * 1024**3,
        metavar="BYTES",
        help="bytes of training datasets one token owner may keep (default 8GiB; 0: no cap)",
    )
    storage.add_argument(
        "--idempotency-ttl",
        type=_at_least(1.0),
        default=24 * 3600.0,
        metavar="SECONDS",
        help="how long a request's Idempotency-Key is remembered for retries (default 86400)",
    )
    storage.add_argument(
        "--history-retention-days",
        type=_at_least(0.0),
        default=30.0,
        metavar="DAYS",
        help="finished jobs without checkpoints and finished runs, with their requests, events, logs and"
        " outputs, are deleted this long after they ended (default 30)",
    )
    serve.add_argument(
        "--fault-injection",
        action="append",
        type=_fault_option,
        default=[],
        metavar="NAME[=SUB_JOB]",
        help=argparse.SUPPRESS,
    )  # testing only: see cortex_backend/faults.py
    serve.add_argument(
        "--tinker-session-timeout",
        type=_at_least(1.0),
        default=300.0,
        metavar="SECONDS",
        help="Tinker API: a session with no SDK heartbeat for this long ends and its training clients complete",
    )
    serve.add_argument(
        "--park-idle-s",
        type=_at_least(0.0),
        default=5.0,
        metavar="SECONDS",
        help="Tinker API: a training client idle this long is parked (state saved, device slot freed) and"
        " brought back by its next request (default: 5; 0: never park)",
    )
    cluster = serve.add_argument_group("executors (docs/scale.md)")
    cluster.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="'local': a worker process per sub-job on this host; 'ray': a Ray actor per sub-job on the"
        " hosts of a Ray cluster (pip install 'cortex-nb[ray]')",
    )
    cluster.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="ray: join this existing cluster (run the backend on its head) instead of starting a head here",
    )
    cluster.add_argument(
        "--ray-port", type=int, default=6379, help="ray: the port of the head this backend starts (0: any)"
    )
    cluster.add_argument(
        "--ray-object-store",
        type=_byte_count,
        default=None,
        metavar="BYTES",
        help="ray: the head's object store size (default: Ray's)",
    )
    cluster.add_argument(
        "--ray-temp-dir",
        type=Path,
        default=None,
        help="ray: a private dir (made 0700) for Ray's temporary files on this host (default: a fresh one in /tmp)",
    )
    cluster.add_argument(
        "--ray-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="ray: the file (0600) holding Ray's authentication token (default DATA_DIR/ray-auth-token, made"
        " for a head started here; hosts join with a copy of it)",
    )
    cluster.add_argument(
        "--ray-insecure",
        action="store_true",
        help="ray: use a --ray-address cluster that runs without Ray's token authentication (anyone who"
        " reaches its ports can run code there); shown in GET /v1/capacity",
    )
    cluster.add_argument(
        "--host-name", default=None, help="ray: the name this host's devices go by (default: its host name)"
    )
    tls = serve.add_argument_group("TLS (docs/deploying.md)")
    tls.add_argument(
        "--tls",
        choices=("self-signed",),
        default=None,
        help="make (once) and keep a self-signed certificate in DATA_DIR/tls and print its SHA-256 fingerprint",
    )
    tls.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM certificate (chain) to serve HTTPS with",
    )
    tls.add_argument(
        "--tls-key", type=Path, default=None, metavar="FILE", help="PEM private key of --tls-cert"
    )
    runs = serve.add_argument_group("source runs (docs/run-spec.md)")
    runs.add_argument(
        "--runs-workspace",
        type=Path,
        default=None,
        help="where runs' work dirs live (default DATA_DIR/workspace)",
    )
    runs.add_argument(
        "--run-namespaces",
        choices=("auto", "off"),
        default="auto",
        help="'auto': each run in a bubblewrap sandbox (read-only minimal root, private /tmp, no network,"
        " own PID namespace) where the host allows; 'off': no sandbox (trusted code only)",
    )
    runs.add_argument(
        "--allow-unsandboxed-runs",
        action="store_true",
        help="run source code even where bubblewrap is missing (no sandbox: a run can read the backend user's"
        " files and reach its port; trusted code only). Without it such a backend refuses source runs;"
        " GET /v1/capacity and every run report say which it is",
    )
    runs.add_argument(
        "--run-address-space-mib",
        type=int,
        default=None,
        help="per-process address-space limit (default: host RAM for CPU runs, none for GPU runs)",
    )
    runs.add_argument("--run-max-file-mib", type=int, default=16 * 1024, help="largest file a run may write")
    runs.add_argument(
        "--run-max-processes",
        type=int,
        default=512,
        help="processes and threads per run (a cgroup pids.max where the host allows; default 512)",
    )
    runs.add_argument(
        "--run-kill-grace",
        type=float,
        default=5.0,
        help="seconds between SIGTERM and SIGKILL when a run is stopped",
    )
    runs.add_argument("--run-tmp-mib", type=int, default=1024, help="size cap of a run's private /tmp")
    runs.add_argument(
        "--run-uid-base",
        type=int,
        default=1_500_000_000,
        help="root backends: runs execute as uids claimed from here upwards, one per slot, each locked"
        " host-wide so backends on one host never share one",
    )
    runs.add_argument(
        "--run-memory-mib",
        type=_at_least(1, int),
        default=None,
        help="memory of a whole run, all its processes together, enforced by a per-run cgroup where the"
        " host allows (default: 3/4 of the host's RAM)",
    )
    runs.add_argument(
        "--run-disk-mib",
        type=_at_least(0, int),
        default=64 * 1024,
        help="bytes a run's work dir may hold; past it the run is stopped (disk_quota_exceeded);"
        " 0: no quota (default 65536)",
    )
    runs.add_argument(
        "--run-cpu-weight",
        type=_at_least(1, int),
        default=100,
        help="CPU weight of a run (cgroup cpu.weight, 1-10000; default 100)",
    )
    runs.add_argument(
        "--run-script-gate",
        choices=GATE_MODES,
        default="warn",
        help="a static check of a run's Python files before it starts: strict refuses (script_refused), warn"
        " reports, off skips (default warn; defence in depth, never a sandbox: docs/security.md)",
    )
    runs.add_argument(
        "--run-script-gate-allow",
        action="append",
        choices=sorted(RULES),
        default=[],
        metavar="RULE",
        help=f"a script-gate rule not to apply, repeatable: {', '.join(sorted(RULES))}",
    )
    # observability
    serve.add_argument(
        "--log-retention-lines",
        type=_at_least(1, int),
        default=100_000,
        help="log lines kept per job; older ones are dropped and reads say how many",
    )
    serve.add_argument(
        "--monitor-interval",
        type=_at_least(0.0),
        default=1.0,
        help="seconds between device samples (GPU via NVML, CPU/RAM via psutil); 0 turns sampling off",
    )
    serve.add_argument(
        "--metrics-retention-hours",
        type=_at_least(0.01),
        default=24.0,
        help="how long device samples are kept",
    )

    stop = commands.add_parser(
        "stop",
        help="drain and stop the backend serving a data dir: training runs pause at a resumable checkpoint"
        " and resume when it starts again",
    )
    stop.add_argument("--data-dir", type=Path, default=default_data_dir())
    stop.add_argument(
        "--wait",
        type=_at_least(0.0),
        default=90.0,
        metavar="SECONDS",
        help="how long to wait for it to exit (default 90; its own --drain-grace bounds the drain)",
    )

    token = commands.add_parser("token", help="manage API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="create a token (printed once)")
    create.add_argument("--name", required=True, help="who the token is for; jobs are owned by this name")
    create.add_argument("--scopes", nargs="+", default=["jobs:read", "jobs:write"], choices=SCOPES)
    create.add_argument(
        "--tinker",
        action="store_true",
        help="print the token with the 'tml-' prefix the Tinker SDK requires (same scopes and owner rules)",
    )
    create.add_argument(
        "--max-priority",
        type=_priority_cap,
        default=None,
        help="the highest queue priority (5-9) this token may ask (default: the backend's --token-max-priority)",
    )
    create.add_argument("--data-dir", type=Path, default=default_data_dir())
    listing = token_commands.add_parser("list", help="list tokens (never their values)")
    listing.add_argument("--data-dir", type=Path, default=default_data_dir())
    revoke = token_commands.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id")
    revoke.add_argument("--data-dir", type=Path, default=default_data_dir())


def _tls_arguments_error(args: argparse.Namespace) -> str | None:
    """Why the TLS options cannot be served as given (checked before anything starts), or None."""
    if args.tls and (args.tls_cert or args.tls_key):
        return "--tls self-signed and --tls-cert/--tls-key exclude each other"
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    if args.tls_cert:
        import ssl

        from .tls import TlsFiles, server_context

        try:
            server_context(TlsFiles(args.tls_cert, args.tls_key))
        except (OSError, ssl.SSLError) as exc:
            return f"cannot serve TLS with {args.tls_cert} and {args.tls_key}: {exc}"
    return None


def run_backend_command(args: argparse.Namespace) -> int:
    if args.backend_command == "serve":
        from .executors.base import ExecutorStartRefused
        from .models import ModelCatalog
        from .server import serve

        tls_error = _tls_arguments_error(args)
        if tls_error:
            print(f"error: {tls_error}", file=sys.stderr)
            return 2

        settings = BackendSettings(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            http_idle_timeout_s=args.http_idle_timeout,
            http_body_timeout_s=args.http_body_timeout,
            max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
            http_first_line_timeout_s=args.http_first_line_timeout,
            storage_retry_s=args.storage_retry,
            models=dict(args.model),
            quantize=quantize_map(args.quantize, dict(args.model)),
            devices=args.devices,
            sub_jobs_per_device=args.sub_jobs_per_device,
            warm_workers=args.warm_workers,
            worker_threads=args.worker_threads,
            adapter_host=args.adapter_host,
            adapter_slots_per_device=args.adapter_slots_per_device,
            worker_start=args.worker_start,
            adapter_host_memory_bytes=args.adapter_host_memory_bytes,
            batch_across_slots=args.batch_across_slots,
            idle_timeout_s=args.idle_timeout,
            idle_exit_s=args.idle_exit,
            drain_grace_s=args.drain_grace,
            sampler=args.sampler,
            vllm_gpu_memory_fraction=args.vllm_gpu_memory_fraction,
            vllm_cpu_kv_cache_gib=args.vllm_cpu_kv_cache_gib,
            vllm_max_loras=args.vllm_max_loras,
            vllm_max_lora_rank=args.vllm_max_lora_rank,
            runs_workspace=args.runs_workspace,
            run_namespaces=args.run_namespaces,
            allow_unsandboxed_runs=args.allow_unsandboxed_runs,
            run_address_space_mib=args.run_address_space_mib,
            run_max_file_mib=args.run_max_file_mib,
            run_max_processes=args.run_max_processes,
            run_kill_grace_s=args.run_kill_grace,
            run_tmp_mib=args.run_tmp_mib,
            run_uid_base=args.run_uid_base,
            run_memory_mib=args.run_memory_mib,
            run_disk_mib=args.run_disk_mib,
            run_cpu_weight=args.run_cpu_weight,
            run_script_gate=args.run_script_gate,
            run_script_gate_allow=tuple(args.run_script_gate_allow),
            log_retention_lines=args.log_retention_lines,
            queue_aging_s=args.queue_aging_s,
            speedtest_per_minute=args.speedtest_per_minute,
            token_max_priority=args.token_max_priority,
            preempt_below=args.preempt_below,
            monitor_interval_s=args.monitor_interval,
            metrics_retention_s=args.metrics_retention_hours * 3600.0,
            checkpoint_quota_bytes=args.checkpoint_quota_bytes or None,
            checkpoint_min_ttl_s=max(1, args.checkpoint_min_ttl),
            fault_injection=tuple(args.fault_injection),
            tinker_session_timeout_s=args.tinker_session_timeout,
            park_idle_s=args.park_idle_s or None,
            upload_ttl_s=args.upload_ttl,
            upload_quota_bytes=args.upload_quota_bytes,
            router_replay_cache_bytes=args.router_replay_cache_bytes,
            dataset_quota_bytes=args.dataset_quota_bytes or None,
            idempotency_ttl_s=args.idempotency_ttl,
            history_retention_s=args.history_retention_days * 86400.0,
            executor=args.executor,
            ray_address=args.ray_address,
            ray_port=args.ray_port,
            ray_object_store_bytes=args.ray_object_store,
            ray_temp_dir=args.ray_temp_dir,
            ray_token_file=args.ray_token_file,
            ray_insecure=args.ray_insecure,
            host_name=args.host_name,
            tls=args.tls,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
        try:
            # Refuse unsafe or broken model directories, and quantization nothing here can do, before starting.
            ModelCatalog(settings.models, settings.quantize)
            check_quantization_backend(settings.quantize)
            check_sampler_setting(settings.sampler)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        problem = _executor_problem(settings)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        try:
            serve(settings)
        except ExecutorStartRefused as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.backend_command == "stop":
        from .backend_stop import stop_backend

        stopped, message = stop_backend(args.data_dir, args.wait)
        print(message)
        return 0 if stopped else 1
    from .auth import TINKER_TOKEN_PREFIX, TOKEN_PREFIX, create_token
    from .store import Store

    store = Store(BackendSettings(data_dir=args.data_dir).db_path)
    if args.token_command == "create":
        try:
            token = create_token(
                store,
                args.name,
                list(args.scopes),
                prefix=TINKER_TOKEN_PREFIX if args.tinker else TOKEN_PREFIX,
                max_priority=args.max_priority,
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(token)
        print(
            f"# token for {args.name} with scopes {' '.join(args.scopes)}; it is shown only this once",
            file=sys.stderr,
        )
    elif args.token_command == "list":
        for row in store.list_tokens():
            state = "revoked" if row["revoked_at"] else "active"
            print(f"{row['id']}\t{row['name']}\t{' '.join(row['scopes'])}\t{state}")
    elif args.token_command == "revoke":
        if not store.revoke_token(args.token_id):
            print(f"error: no active token {args.token_id}", file=sys.stderr)
            return 1
        print(f"revoked {args.token_id}")
    return 0


def _executor_problem(settings: BackendSettings) -> str | None:
    if settings.executor != "ray":
        if settings.devices.strip().lower() == "none":
            return "--devices none needs --executor ray (a local backend with no devices could run nothing)"
        return None
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return "--executor ray needs Ray: pip install 'cortex-nb[ray]'"
    if settings.ray_insecure and settings.ray_address is None:
        return "--ray-insecure is only for a --ray-address cluster: the head a backend starts always uses a token"
    if settings.sampler == "vllm":
        return (
            "--sampler vllm is not available with --executor ray yet: sub-jobs on Ray hosts sample with the"
            " built-in engine (use --sampler auto or transformers)"
        )
    return None


def add_host_join_arguments(join: argparse.ArgumentParser) -> None:
    """`cortex-nb host join HEAD_ADDRESS ...` (docs/scale.md)."""
    join.add_argument(
        "head_address", metavar="HEAD_ADDRESS", help="the Ray head's HOST:PORT (the backend prints it)"
    )
    join.add_argument(
        "--name", default=None, help="the name this host's devices go by (default: its host name)"
    )
    join.add_argument(
        "--model",
        action="append",
        type=_model_option,
        default=[],
        metavar="NAME=DIR",
        help="a local Hugging Face model directory on this host (safetensors only); repeatable",
    )
    join.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="register every model directory in DIR (each subdirectory with a config.json, by its name)",
    )
    join.add_argument(
        "--devices", default="auto", help="'auto', 'cpu', 'cpu:N' (N slots) or GPU indices like '0,1'"
    )
    join.add_argument(
        "--sub-jobs-per-device",
        type=_at_least(1, int),
        default=1,
        help="sub-jobs sharing one GPU (each reserves num_gpus=1/N); default 1",
    )
    join.add_argument(
        "--object-store",
        type=_byte_count,
        default=None,
        metavar="BYTES",
        help="this host's Ray object store size (default: Ray's)",
    )
    join.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a copy (0600) of the head's Ray token (its DATA_DIR/ray-auth-token); without it the token is"
        " asked for at a prompt. Never give the token itself on the command line",
    )
    join.add_argument(
        "--block", action="store_true", help="stay in the foreground; the host leaves when this command stops"
    )


def run_host_join(args: argparse.Namespace) -> int:
    from .executors.ray_cluster.join import join

    return join(
        args.head_address,
        name=args.name,
        models=dict(args.model),
        models_dir=args.models_dir,
        devices=args.devices,
        sub_jobs_per_device=args.sub_jobs_per_device,
        object_store_bytes=args.object_store,
        block=args.block,
        token_file=args.token_file,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cortex-backend")
    add_backend_commands(parser)
    sys.exit(run_backend_command(parser.parse_args(argv)))
