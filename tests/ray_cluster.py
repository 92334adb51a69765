"""A real multi-node Ray cluster on this machine, for the Ray executor's tests: a backend that starts the
Ray head (and serves the head's own CPU slot as host "a"), and hosts joined with `cortex-nb host join`,
each its own Ray node (raylet, object store, agents) in a process group of its own.

Kept small for a shared 2-core machine: one CPU slot per host, 100 MB object stores, no Ray dashboard
or log monitor. Every process is stopped by its process group at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from cortex_nb import Client

from .backend_process import BackendProcess, start_backend

OBJECT_STORE = "100M"
# Ray notices a host gone after `period x threshold` of missed health checks (Ray's default is ~15 s).
RAY_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "4",
    "RAY_health_check_timeout_ms": "1000",
}
START_TIMEOUT_S = 420.0


@dataclass
class JoinedHost:
    name: str
    process: subprocess.Popen
    log_path: Path

    def raylet(self) -> psutil.Process:
        return next(
            child
            for child in psutil.Process(self.process.pid).children(recursive=True)
            if child.name() == "raylet"
        )

    def kill(self) -> None:
        """The test is over: the host's whole process group (Ray's processes and actors on it) goes at once."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


@dataclass
class RayCluster:
    backend: BackendProcess
    ray_address: str
    temp_dir: Path
    hosts: dict[str, JoinedHost] = field(default_factory=dict)

    def client(self) -> Client:
        return Client(self.backend.url, self.backend.token)

    @property
    def token_file(self) -> Path:
        """The head's Ray token (the backend made it in its data dir); hosts join with it."""
        return self.backend.data_dir / "ray-auth-token"

    def join(
        self, name: str, *args: str, wait: bool = True, token_file: Path | None | str = "head"
    ) -> JoinedHost:
        """`host join` with the head's token file (or `token_file`, or none at all when None)."""
        log_path = self.backend.data_dir / f"host-{name}.log"
        if token_file == "head":
            token_file = self.token_file
        token_args = ["--token-file", str(token_file)] if token_file is not None else []
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cortex_nb.cli",
                    "host",
                    "join",
                    self.ray_address,
                    "--name",
                    name,
                    "--devices",
                    "cpu:1",
                    "--object-store",
                    OBJECT_STORE,
                    "--block",
                    *token_args,
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # The host's private Ray dir goes in the test's own (removed at the end).
                env={**os.environ, **RAY_ENV, "TMPDIR": str(self.temp_dir)},
            )
        host = JoinedHost(name, process, log_path)
        self.hosts[name] = host
        if wait:
            self.wait_for_hosts(lambda names: name in names, f"host {name} to join")
        return host

    def host_names(self) -> set[str]:
        with self.client() as client:
            return {host["host"] for host in client.get_capacity()["hosts"]}

    def wait_for_hosts(self, condition, what: str, timeout_s: float = START_TIMEOUT_S) -> set[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            names = self.host_names()
            if condition(names):
                return names
            for host in self.hosts.values():
                if host.process.poll() is not None and host.name not in names and "left" not in what:
                    raise RuntimeError(
                        f"host {host.name} exited {host.process.returncode}:\n{host.log_path.read_text()[-3000:]}"
                    )
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}; hosts now {sorted(self.host_names())}")

    def stop(self) -> None:
        self.backend.stop(timeout_s=60.0)
        for host in self.hosts.values():
            host.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_ray_cluster(data_dir: Path, *backend_args: str) -> RayCluster:
    """The backend on a Ray head it starts (host "a", one CPU slot); join more hosts with `.join`."""
    # Ray's socket paths must stay short (the kernel caps them at 107 bytes): a short dir of its own.
    temp_dir = Path(tempfile.mkdtemp(prefix="crt", dir="/tmp"))
    try:
        backend = start_backend(
            data_dir,
            "--executor",
            "ray",
            "--devices",
            "cpu:1",
            "--host-name",
            "a",
            "--ray-port",
            "0",
            "--ray-temp-dir",
            str(temp_dir),
            "--ray-object-store",
            OBJECT_STORE,
            "--worker-threads",
            "1",
            *backend_args,
            timeout_s=START_TIMEOUT_S,
            env=RAY_ENV,
        )
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    info = json.loads((data_dir / "backend.json").read_text())
    return RayCluster(backend, info["executor"]["ray_address"], temp_dir)
