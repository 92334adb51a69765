"""Start and stop a real backend process on loopback for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class BackendProcess:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen
    # An HTTPS backend's certificate fingerprint (`sha256:...`), which clients pin; None for plain HTTP.
    fingerprint: str | None = None
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def kill(self) -> None:
        """Die without cleaning up (as in a power cut): SIGKILL the whole process group."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    @property
    def httpx_verify(self):
        """What httpx needs to reach this backend (its pinned certificate when it serves HTTPS)."""
        from cortex_nb.tls import httpx_verify

        return httpx_verify(self.fingerprint or True)

    def log(self) -> str:
        return (self.log_path or self.data_dir / "backend.log").read_text(errors="replace")

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/version", timeout=5, verify=self.httpx_verify).status_code == 200
        except httpx.HTTPError:
            return False


def start_backend(
    data_dir: Path,
    *args: str,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    python: str | None = None,
    prefix: list[str] | None = None,
    clean_env: dict[str, str] | None = None,
) -> BackendProcess:
    """Start `cortex_backend serve` on an ephemeral port. `prefix` wraps the command (e.g. setpriv to run it
    as another user); `clean_env` replaces the environment instead of extending ours."""
    data_dir.mkdir(parents=True, exist_ok=True)
    endpoint = data_dir / "backend.json"
    endpoint.unlink(missing_ok=True)
    log = open(data_dir.parent / f"{data_dir.name}.log" if prefix else data_dir / "backend.log", "ab")  # noqa: SIM115
    if clean_env is not None:
        environment = {**clean_env, **(env or {})}
    else:
        environment = {**os.environ, **env} if env else None
    process = subprocess.Popen(
        [
            *(prefix or []),
            python or sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=environment,
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"backend exited {process.returncode}:\n{Path(log.name).read_text()[-3000:]}")
        if endpoint.exists():
            info = json.loads(endpoint.read_text())
            if info["pid"] == process.pid:
                token = Path(info["admin_token_file"]).read_text().strip()
                return BackendProcess(
                    info["url"], token, data_dir, process, info.get("tls_fingerprint"), Path(log.name)
                )
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("backend did not start in time")
