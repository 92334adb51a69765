"""`cortex-nb host join HEAD_ADDRESS`: this machine joins the head's Ray cluster as a cortex-nb host.

Before Ray starts anything here it proves the head's Ray token (`--token-file`, or typed at a prompt;
never on the command line) with a GCS read, which the head refuses without it, and checks that a
backend runs on that head and that this host's Python, torch, cortex-nb and Ray match the head's: a
sub-job's actor runs the head's code on this host's libraries. Then it publishes the host's record (devices, models with their config
and tokenizer files) and runs Ray's own `ray start --address` with the resources that name this host and
its models. Nothing is started when a check fails.
"""

from __future__ import annotations

import getpass
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from cortex_nb.protocol.model_names import is_model_name

from ...devices import detect_devices
from ...models import TINY, inspect_model_dir
from .cluster_token import ClusterTokenError, apply_to_this_process, read_token_file, token_environment
from .confinement import private_root, ray_temp_dir, remove_root
from .head import START_ATTEMPTS, AgentPortWatcher, ray_environment, start_arguments
from .registry import HEAD_KEY, HOST_PREFIX, ClusterStore, host_record, node_resources
from .versions import local_versions, mismatches

CONNECT_TIMEOUT_S = 10.0
# \Z, not $: "$" also matches before a trailing newline.
HOST_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
STARTED_TEXT = "Ray runtime started"


class JoinRefused(Exception):
    """This host may not join; the message says why and what to do."""


def _reachable(address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise JoinRefused(
            f"cannot reach the Ray head at {address} ({exc}); check the address the backend printed"
        ) from None


def _models(models: dict[str, str], models_dir: Path | None) -> dict:
    named = dict(models)
    if models_dir is not None:
        if not models_dir.is_dir():
            raise JoinRefused(f"--models-dir {models_dir} is not a directory")
        for path in sorted(models_dir.iterdir()):
            if (path / "config.json").is_file() and is_model_name(path.name) and path.name != TINY:
                named.setdefault(path.name, str(path))
    infos = {}
    for name, path in named.items():
        try:
            infos[name] = inspect_model_dir(name, Path(path).expanduser().resolve())
        except ValueError as exc:
            raise JoinRefused(str(exc)) from None
    return infos


def token_env(token_file: Path | None) -> dict[str, str]:
    """Ray's token for this host's Ray processes: a file's path, or a token typed at a prompt."""
    if token_file is not None:
        try:
            read_token_file(token_file)
        except ClusterTokenError as exc:
            raise JoinRefused(str(exc)) from None
        return token_environment(token_file.expanduser().absolute())
    if not sys.stdin.isatty():
        raise JoinRefused(
            "joining needs the head's Ray token: copy the head's DATA_DIR/ray-auth-token here (chmod 600) and"
            " pass --token-file FILE, or run this at a terminal to type it"
        )
    token = getpass.getpass("the head's Ray token (its DATA_DIR/ray-auth-token): ").strip()
    if not token:
        raise JoinRefused("no token given")
    return token_environment(token=token)


def read_head_record(head_address: str) -> tuple[ClusterStore, dict | None]:
    """The head's GCS and its record, reached with this host's token: the head refuses a wrong or missing
    one (Ray answers on connecting, or on the first read)."""
    from ray.exceptions import AuthenticationError

    try:
        store = ClusterStore(head_address)
        return store, store.get(HEAD_KEY)
    except AuthenticationError:
        raise JoinRefused(
            f"the Ray head at {head_address} refused this host's token; use a copy of the head's"
            " DATA_DIR/ray-auth-token"
        ) from None


def check(store: ClusterStore, head: dict | None, name: str, models: dict) -> None:
    """Refuse to join a head without a backend, with other versions, or where `name` is taken."""
    if head is None:
        raise JoinRefused(
            f"no cortex-nb backend has started on the Ray head at {store.address}; start it there first with"
            " `cortex-nb backend serve --executor ray`"
        )
    differences = mismatches(head["versions"], local_versions())
    if differences:
        raise JoinRefused(
            "this host's versions differ from the head's, so it may not join:\n  "
            + "\n  ".join(differences)
            + "\ninstall the head's versions here (same Python minor version, torch, cortex-nb and Ray), then"
            " join again"
        )
    if name in store.live_host_names():
        raise JoinRefused(f"a host named {name!r} is already in the cluster; choose another with --name")
    for model, info in models.items():
        for other in store.host_records().values():
            entry = other.get("models", {}).get(model)
            if entry is not None and entry["config"] != info.config and other["name"] != name:
                raise JoinRefused(
                    f"model {model!r} here differs from the one host {other['name']!r} registered (their"
                    " config.json differ); register it under another name"
                )


def join(
    head_address: str,
    *,
    name: str | None,
    models: dict[str, str],
    models_dir: Path | None,
    devices: str,
    sub_jobs_per_device: int,
    object_store_bytes: int | None,
    block: bool,
    token_file: Path | None = None,
) -> int:
    name = name or socket.gethostname()
    try:
        if not HOST_NAME_PATTERN.fullmatch(name):
            raise JoinRefused(f"host name {name!r} is not allowed; use letters, digits and _.:-")
        infos = _models(models, models_dir)
        try:
            host_devices = detect_devices(devices, sub_jobs_per_device)
        except ValueError as exc:
            raise JoinRefused(str(exc)) from None
        auth_env = token_env(token_file)
        _reachable(head_address)
        apply_to_this_process(auth_env)
        store, head = read_head_record(head_address)
        check(store, head, name, infos)
    except JoinRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store.put(HOST_PREFIX + name, host_record(name, local_versions(), host_devices, infos))
    node = node_resources(name, host_devices, list(infos))
    print(
        f"host {name} joins {head_address}: {', '.join(f'{d.id} ({d.slots} slots)' for d in host_devices)};"
        f" models: {', '.join(sorted({TINY, *infos}))}",
        flush=True,
    )
    for attempt in range(1, START_ATTEMPTS + 1):
        # Ray's files here go in a dir only this user may enter (Ray makes its own dirs 0777).
        temp_root, _ = private_root(None)
        command = [
            # Ray's CLI, keeping a loopback head address (and so this node's) on loopback.
            sys.executable,
            "-m",
            "cortex_backend.executors.ray_cluster.ray_cli",
            "start",
            "--address",
            head_address,
            "--temp-dir",
            str(ray_temp_dir(temp_root)),
            *start_arguments(node, object_store_bytes),
        ]
        if block:
            command.append("--block")
        print("$ " + " ".join(shlex.quote(part) for part in command), flush=True)
        code, started = _run_ray_start(command, auth_env)
        if block:  # Ray has stopped here: its files go too
            remove_root(temp_root)
        if started or attempt == START_ATTEMPTS:
            return code
        print(
            f"Ray did not start on this host (exit code {code}); starting it again (attempt {attempt + 1} of"
            f" {START_ATTEMPTS})",
            file=sys.stderr,
            flush=True,
        )
    return 1


def _run_ray_start(command: list[str], auth_env: dict[str, str]) -> tuple[int, bool]:
    """Run Ray's own `ray start`, passing its output on and a stop signal to it; (exit code, whether the
    node came up). With --block it runs until stopped: stopping this command stops the host's Ray."""
    process = subprocess.Popen(
        command,
        env=ray_environment(auth_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    watcher = AgentPortWatcher(process.pid)
    watcher.start()
    forward = lambda signum, frame: process.send_signal(signal.SIGTERM)  # noqa: E731
    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    started = False
    try:
        for raw in process.stdout:
            sys.stdout.write(raw.decode(errors="replace"))
            sys.stdout.flush()
            if not started and STARTED_TEXT in raw.decode(errors="replace"):
                started = True
                watcher.stopped.set()
        code = process.wait()
    finally:
        watcher.stopped.set()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code, started or code == 0
