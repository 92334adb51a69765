"""The embedded backend: a `cortex-nb backend serve` subprocess on a free loopback port.

`Client.local()` reuses a backend already serving the same data dir (another kernel's), or starts
one it owns and stops when this process exits.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .errors import CortexError


def default_local_dir() -> Path:
    """$CORTEX_LOCAL_DIR if set (CI, a scratch disk), else $XDG_DATA_HOME/cortex-nb/local."""
    if os.environ.get("CORTEX_LOCAL_DIR"):
        return Path(os.environ["CORTEX_LOCAL_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "cortex-nb" / "local"


@dataclass
class LocalBackend:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen | None  # None when reusing someone else's

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def running_endpoint(endpoint_file: Path) -> dict | None:
    """The endpoint file of a backend whose process is alive: it may not answer yet, or any more."""
    try:
        endpoint = json.loads(endpoint_file.read_text())
        os.kill(int(endpoint["pid"]), 0)
        return endpoint
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(endpoint_file: Path) -> dict | None:
    """The endpoint of a backend that answers."""
    endpoint = running_endpoint(endpoint_file)
    try:
        if endpoint is not None:
            httpx.get(endpoint["url"] + "/version", timeout=2.0).raise_for_status()
            return endpoint
    except (KeyError, httpx.HTTPError):
        pass
    return None


def ensure_local_backend(
    data_dir: str | Path | None = None,
    models: dict[str, str] | None = None,
    devices: str = "auto",
    warm_workers: int = 1,
    start_timeout_s: float = 120.0,
) -> LocalBackend:
    data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_local_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    endpoint_file = data_dir / "backend.json"
    running = _alive(endpoint_file)
    if running is not None:
        return LocalBackend(running["url"], Path(running["token_file"]).read_text().strip(), data_dir, None)
    endpoint_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "cortex_backend", "serve", "--port", "0", "--data-dir", str(data_dir),
               "--devices", devices, "--warm-workers", str(warm_workers), "--parent-pid", str(os.getpid()),
               # The built-in sampler: an embedded backend shares the notebook's machine, where vLLM's start-up
               # time and memory reservation cost more than they bring.
               "--sampler", "transformers"]
    for name, path in (models or {}).items():
        command += ["--model", f"{name}={path}"]
    log_file = open(data_dir / "backend.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log_file.close()
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (data_dir / "backend.log").read_text(errors="replace")[-2000:]
            raise CortexError(f"the embedded backend exited with code {process.returncode}:\n{tail}", code="backend_unavailable")
        endpoint = _alive(endpoint_file)
        if endpoint is not None and int(endpoint["pid"]) == process.pid:
            backend = LocalBackend(endpoint["url"], Path(endpoint["token_file"]).read_text().strip(), data_dir, process)
            atexit.register(backend.stop)
            return backend
        time.sleep(0.1)
    process.kill()
    raise CortexError(f"the embedded backend did not start within {start_timeout_s:.0f}s; see {data_dir / 'backend.log'}",
                      code="backend_unavailable")
