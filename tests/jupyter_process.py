"""Start and stop a real Jupyter server (`jupyter server` or `jupyter lab`) on loopback for tests: either
with the cortex_server extension pointed at a backend through command-line config (not the environment,
so kernels started by it inherit no backend settings), or as a new user has it: a fresh HOME and no
cortex settings at all, so the extension and kernels find the local backend by the documented defaults."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class JupyterProcess:
    url: str  # with base_url, ending in "/"
    token: str
    runtime_dir: Path
    process: subprocess.Popen
    log_path: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def jupyter_env(home: Path, fresh_home: bool = False) -> dict[str, str]:
    """An environment with its own Jupyter dirs and no cortex backend settings; with `fresh_home`, HOME is
    `home` and no CORTEX_* or XDG_* variable is left (a new user's defaults)."""
    dropped = ("CORTEX_", "XDG_", "JUPYTER") if fresh_home else ("CORTEX_URL", "CORTEX_TOKEN", "JUPYTER")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    if fresh_home:
        env["HOME"] = str(home)
    env.update(
        {
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
            "JUPYTER_PLATFORM_DIRS": "1",
        }
    )
    return env


def start_jupyter_for(backend, home: Path, **kwargs) -> JupyterProcess:
    """Jupyter for a running test backend: its token goes into a file beside the server, where the
    extension reads it (as on a real host), and the server lives under `home`/jupyter."""
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "backend.token"
    token_file.write_text(backend.token)
    return start_jupyter(home / "jupyter", backend.url, token_file, **kwargs)


def local_dir_of(home: Path) -> Path:
    """Where the local backend of a user with HOME=`home` and no settings keeps its state file."""
    return home / ".local" / "share" / "cortex-nb" / "local"


def stop_local_backend(local_dir: Path, timeout_s: float = 30.0) -> None:
    """Stop the local backend whose state file is in `local_dir`, if one runs (tests stop what they start)."""
    from cortex_nb.local import running_endpoint

    endpoint = running_endpoint(local_dir / "backend.json")
    if endpoint is None:
        return
    pid = int(endpoint["pid"])
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)


def start_jupyter(
    home: Path,
    backend_url: str | None,
    token_file: Path | None,
    *,
    app: str = "server",
    base_url: str = "/",
    extra_args: tuple[str, ...] = (),
    timeout_s: float = 90.0,
    fresh_home: bool = False,
) -> JupyterProcess:
    """With `backend_url` None the extension gets no cortex settings (it then uses the local backend)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "root").mkdir(exist_ok=True)
    token = secrets.token_hex(16)
    port = free_port()
    module = {"server": "jupyter_server", "lab": "jupyterlab"}[app]
    if app == "lab":
        # No news or update toasts: nothing outside loopback is reachable, and a toast steals focus.
        (home / "config").mkdir(exist_ok=True)
        (home / "config" / "jupyter_server_config.json").write_text(
            json.dumps(
                {
                    "LabApp": {
                        "news_url": None,
                        "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate",
                    }
                }
            )
        )
        settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
        # Every cell stays in the page (JupyterLab 4 otherwise renders only cells near the viewport), so a
        # test can read any cell's output without scrolling to it.
        notebook_settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "notebook-extension"
        notebook_settings.mkdir(parents=True, exist_ok=True)
        (notebook_settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    log_path = home / f"jupyter-{app}.log"
    log = open(log_path, "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            *(["--allow-root"] if os.geteuid() == 0 else []),
            f"--ServerApp.base_url={base_url}",
            f"--ServerApp.root_dir={home / 'root'}",
            "--ServerApp.jpserver_extensions={'cortex_server': True}",
            *(
                [f"--CortexServerApp.backend_url={backend_url}", f"--CortexServerApp.token_file={token_file}"]
                if backend_url is not None
                else []
            ),
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=jupyter_env(home, fresh_home),
        start_new_session=True,
    )
    log.close()
    info_file = home / "runtime" / f"jpserver-{process.pid}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter {app} exited {process.returncode}:\n{log_path.read_text()[-4000:]}")
        if info_file.exists():
            try:
                info = json.loads(info_file.read_text())
            except ValueError:
                info = None
            if info:
                jupyter = JupyterProcess(info["url"], token, home / "runtime", process, log_path)
                try:
                    if (
                        httpx.get(
                            jupyter.url + "api/status", headers=jupyter.headers(), timeout=5
                        ).status_code
                        == 200
                    ):
                        return jupyter
                except httpx.HTTPError:
                    pass
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    raise RuntimeError(f"jupyter {app} did not start in time:\n{log_path.read_text()[-4000:]}")
