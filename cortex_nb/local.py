"""The per-user local backend: one `cortex-nb backend serve` on a loopback port, found through one state
file, shared by every kernel and the Jupyter server of this user, and tied to none of them.

    endpoint = ensure_local_backend()     # find it, or start it (detached, its own session)
    Client(endpoint.url, endpoint.token)  # what `%cortex connect --local` and `Client.local()` do

The state file is `default_local_dir() / "backend.json"` (the backend writes it when it serves, mode
0600): its URL, pid and the file of a token for this user's processes (`user.token`: owner = the OS user,
scopes jobs:read jobs:write runs:write). The backend outlives kernel restarts and stops by itself after
`IDLE_EXIT_S` with no jobs or runs. Torch-free: the Jupyter server extension imports this too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import CortexError
from .local_identity import ensure_private_dir, is_backend_process, listener_problem
from .protocol.backend_proof import new_challenge, proves

STATE_FILE = "backend.json"
LOCK_FILE = "backend.lock"
# The local backend stops after this many seconds with no job queued or running and no source run.
IDLE_EXIT_S = 1800.0


def default_local_dir() -> Path:
    """$CORTEX_LOCAL_DIR if set (CI, a scratch disk), else $XDG_DATA_HOME/cortex-nb/local."""
    if os.environ.get("CORTEX_LOCAL_DIR"):
        return Path(os.environ["CORTEX_LOCAL_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "cortex-nb" / "local"


@dataclass
class LocalEndpoint:
    """A running local backend: where it listens and the token this user's processes use."""

    url: str
    token: str
    pid: int
    data_dir: Path
    version: str
    # Set when the backend serves HTTPS: its certificate's fingerprint, which clients pin.
    tls_fingerprint: str | None = None
    # Whether this call started it (a one-shot command such as `cortex-nb demo` stops what it started).
    started: bool = False
    # The backend process's start time as its state file records it: only that process is signalled.
    pid_start: str | None = None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the backend (SIGTERM, then SIGKILL of its process group) and wait for it to go; a
        process that is no longer this backend (gone, its pid reused) is never signalled."""
        if not is_backend_process(self.pid, self.pid_start):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        if not wait_for_exit(self.pid, timeout_s) and is_backend_process(self.pid, self.pid_start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            wait_for_exit(self.pid, 5.0)


def _resolve(data_dir: str | Path | None) -> Path:
    return Path(data_dir).expanduser().resolve() if data_dir else default_local_dir().expanduser().resolve()


def running_endpoint(endpoint_file: Path) -> dict | None:
    """The state file of a backend whose process is alive and is the one that wrote it (this user's,
    started when recorded, running `cortex_backend serve`): it may not answer yet, or any more."""
    try:
        endpoint = json.loads(endpoint_file.read_text())
        if not is_backend_process(int(endpoint["pid"]), endpoint.get("pid_start")):
            return None
        return endpoint
    except (OSError, ValueError, KeyError, TypeError):
        return None


def proven_problem(endpoint: dict, timeout_s: float = 2.0) -> str | None:
    """Why the listener at the state file's URL is not proven to be its backend (None once it is): the
    socket's owner where the OS says it, then a fresh challenge answered with the nonce's proof. Call
    this, and get None, before any token goes to that URL."""
    # here, not at import: the Jupyter proxy reads this module's paths and never loads the SDK
    from .api import probe_version

    url, nonce = endpoint.get("url"), endpoint.get("nonce")
    if not isinstance(url, str) or not isinstance(nonce, str):
        return "the state file names no URL or nonce (a backend of an older version, or not a backend's)"
    problem = listener_problem(url, int(endpoint["pid"]))
    if problem is not None:
        return problem
    challenge = new_challenge()
    try:
        answer = probe_version(
            url, verify=endpoint.get("tls_fingerprint") or True, timeout_s=timeout_s, challenge=challenge
        )
    except CortexError as exc:
        return f"{url} does not answer: {exc.message}"
    if not proves(nonce, challenge, answer.get("proof")):
        return f"the listener at {url} could not prove it is the backend its state file names"
    return None


def _token_file(endpoint: dict, data_dir: Path) -> Path:
    """The user token's file, which must lie in the state file's own dir (never a path it points elsewhere)."""
    path = Path(endpoint["token_file"]).expanduser().resolve()
    if path.parent != data_dir:
        raise ValueError(f"token file {path} is outside {data_dir}")
    return path


def find_local_backend(data_dir: str | Path | None = None, timeout_s: float = 2.0) -> LocalEndpoint | None:
    """The local backend of `data_dir` (default `default_local_dir()`) if its process is alive and its
    listener proves it is that backend; None otherwise. LocalDirUnsafe if the dir is not the user's own."""
    data_dir = _resolve(data_dir)
    ensure_private_dir(data_dir)
    endpoint = running_endpoint(data_dir / STATE_FILE)
    if endpoint is None:
        return None
    try:
        if proven_problem(endpoint, timeout_s) is not None:
            return None
        token = _token_file(endpoint, data_dir).read_text().strip()
        return LocalEndpoint(
            endpoint["url"],
            token,
            int(endpoint["pid"]),
            data_dir,
            str(endpoint.get("version", "?")),
            endpoint.get("tls_fingerprint"),
            pid_start=endpoint.get("pid_start"),
        )
    except (KeyError, ValueError, OSError, CortexError):
        return None


def ensure_local_backend(
    data_dir: str | Path | None = None,
    models: dict[str, str] | None = None,
    devices: str = "auto",
    warm_workers: int = 1,
    idle_exit_s: float = IDLE_EXIT_S,
    start_timeout_s: float = 120.0,
) -> LocalEndpoint:
    """Find the local backend, or start it: as its own session (no kernel is its parent), safe against
    two callers racing (a lock file), and wait until it answers. A backend that runs but is slow to
    answer is waited for, never killed."""
    data_dir = _resolve(data_dir)
    ensure_private_dir(data_dir)
    found = find_local_backend(data_dir)
    if found is not None:
        return found
    with _locked(data_dir / LOCK_FILE):
        found = find_local_backend(data_dir)  # another caller may have started it while we waited
        if found is not None:
            return found
        previous = running_endpoint(data_dir / STATE_FILE)
        if previous is not None:
            found = _wait_for_running(data_dir, previous, start_timeout_s)
            if found is not None:
                return found
        return _start(data_dir, models or {}, devices, warm_workers, idle_exit_s, start_timeout_s)


def _wait_for_running(data_dir: Path, endpoint: dict, timeout_s: float) -> LocalEndpoint | None:
    """Our backend runs but did not answer in time (busy, or still starting): wait for it. None if it
    exits meanwhile (then a new one may start); an error naming it if it never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if running_endpoint(data_dir / STATE_FILE) is None:
            return None
        found = find_local_backend(data_dir, timeout_s=min(10.0, max(1.0, deadline - time.monotonic())))
        if found is not None:
            return found
        time.sleep(0.2)
    problem = proven_problem(endpoint) or "it does not answer"
    raise CortexError(
        f"the local backend (pid {endpoint['pid']}) runs but has not answered for {timeout_s:.0f}s ({problem});"
        f" it was left running. Wait and connect again, or stop it (kill {endpoint['pid']}); its log is"
        f" {data_dir / 'backend.log'}",
        code="backend_unavailable",
    )


def _start(
    data_dir: Path,
    models: dict[str, str],
    devices: str,
    warm_workers: int,
    idle_exit_s: float,
    start_timeout_s: float,
) -> LocalEndpoint:
    # Whatever the state file names is not a running backend of ours (checked by the caller): stale.
    state = data_dir / STATE_FILE
    state.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "cortex_backend",
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        "--devices",
        devices,
        "--warm-workers",
        str(warm_workers),
        "--idle-exit",
        str(idle_exit_s),
        # The built-in sampler: the local backend shares the notebook's machine, where vLLM's start-up
        # time and memory reservation cost more than they bring.
        "--sampler",
        "transformers",
    ]
    for name, path in models.items():
        command += ["--model", f"{name}={path}"]
    log_path = data_dir / "backend.log"
    with open(log_path, "ab") as log_file:
        # Its own session, stdin closed, output to its log: no kernel, terminal or Jupyter server owns it.
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise CortexError(
                f"the local backend exited with code {process.returncode}:\n{tail}",
                code="backend_unavailable",
            )
        found = find_local_backend(data_dir)
        if found is not None and found.pid == process.pid:
            found.started = True
            return found
        time.sleep(0.1)
    process.kill()
    raise CortexError(
        f"the local backend did not start within {start_timeout_s:.0f}s; see {log_path}",
        code="backend_unavailable",
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (released when the holder exits, however it exits)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def process_exited(pid: int) -> bool:
    """Gone, or a zombie: a process that has exited but was not reaped (yet, or ever, under a container
    init that does not reap) still answers signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    """Wait until a process has exited; False if it still runs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_exited(pid):
            return True
        time.sleep(0.1)
    return process_exited(pid)
