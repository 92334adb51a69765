"""`cortex-nb backend ...`: serve, and manage tokens; `cortex-nb host join` (a host joins a Ray cluster)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cortex_nb.protocol.routes import SCOPES

from .config import BackendSettings, default_data_dir
from .samplers import SAMPLER_SETTINGS, check_sampler_setting


def _model_option(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError("use NAME=DIR, e.g. --model llama-1b=/models/llama-1b")
    return name, path


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
        "--port", type=int, default=8765, help="port (0 picks a free one; see DATA_DIR/backend.json)"
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
        "--devices",
        default="auto",
        help="'auto', 'cpu', 'cpu:N' (N slots) or GPU indices like '0,1'; with --executor ray also 'none'"
        " (the head serves no devices of its own)",
    )
    serve.add_argument(
        "--sub-jobs-per-device", type=int, default=4, help="sub-jobs sharing one device before jobs queue"
    )
    serve.add_argument(
        "--warm-workers", type=int, default=1, help="idle pre-started worker processes per device"
    )
    serve.add_argument("--worker-threads", type=int, default=None, help="torch threads per CPU worker")
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
        "--checkpoint-quota-bytes",
        type=_byte_count,
        default=50 * 1024**3,
        metavar="BYTES",
        help="most bytes of checkpoints one token owner may keep (e.g. 50000000000 or 50G; 0: no cap;"
        " default 50GiB)",
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
        help="ray: Ray's temporary dir on this host (default /tmp/ray)",
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
            models=dict(args.model),
            devices=args.devices,
            sub_jobs_per_device=args.sub_jobs_per_device,
            warm_workers=args.warm_workers,
            worker_threads=args.worker_threads,
            idle_timeout_s=args.idle_timeout,
            idle_exit_s=args.idle_exit,
            sampler=args.sampler,
            vllm_gpu_memory_fraction=args.vllm_gpu_memory_fraction,
            vllm_cpu_kv_cache_gib=args.vllm_cpu_kv_cache_gib,
            runs_workspace=args.runs_workspace,
            run_namespaces=args.run_namespaces,
            run_address_space_mib=args.run_address_space_mib,
            run_max_file_mib=args.run_max_file_mib,
            run_max_processes=args.run_max_processes,
            run_kill_grace_s=args.run_kill_grace,
            run_tmp_mib=args.run_tmp_mib,
            run_uid_base=args.run_uid_base,
            run_memory_mib=args.run_memory_mib,
            run_disk_mib=args.run_disk_mib,
            run_cpu_weight=args.run_cpu_weight,
            log_retention_lines=args.log_retention_lines,
            monitor_interval_s=args.monitor_interval,
            metrics_retention_s=args.metrics_retention_hours * 3600.0,
            checkpoint_quota_bytes=args.checkpoint_quota_bytes or None,
            fault_injection=tuple(args.fault_injection),
            tinker_session_timeout_s=args.tinker_session_timeout,
            upload_ttl_s=args.upload_ttl,
            upload_quota_bytes=args.upload_quota_bytes,
            dataset_quota_bytes=args.dataset_quota_bytes or None,
            idempotency_ttl_s=args.idempotency_ttl,
            history_retention_s=args.history_retention_days * 86400.0,
            executor=args.executor,
            ray_address=args.ray_address,
            ray_port=args.ray_port,
            ray_object_store_bytes=args.ray_object_store,
            ray_temp_dir=args.ray_temp_dir,
            host_name=args.host_name,
            tls=args.tls,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
        try:
            ModelCatalog(settings.models)  # refuse unsafe or broken model directories before starting
            check_sampler_setting(settings.sampler)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        problem = _executor_problem(settings)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        serve(settings)
        return 0
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
        "--block", action="store_true", help="stay in the foreground; the host leaves when this command stops"
    )


def run_host_join(args: argparse.Namespace) -> int:
    from .ray_cluster.join import join

    return join(
        args.head_address,
        name=args.name,
        models=dict(args.model),
        models_dir=args.models_dir,
        devices=args.devices,
        sub_jobs_per_device=args.sub_jobs_per_device,
        object_store_bytes=args.object_store,
        block=args.block,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cortex-backend")
    add_backend_commands(parser)
    sys.exit(run_backend_command(parser.parse_args(argv)))
