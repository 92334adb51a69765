"""The Ray head a backend starts for itself (`backend serve --executor ray` without `--ray-address`).

It is Ray's own `ray start --head --block`, as a child process: it lives as long as the backend (the
kernel sends it SIGTERM if the backend dies without cleaning up) and is stopped when the backend stops.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..environment import scrubbed_environment
from .confinement import head_binding

log = logging.getLogger("cortex_backend.executors.ray_cluster")

ADDRESS_LINE = re.compile(r"--address='([^']+)'")
READY_TEXT = "This command will now block forever"
# Ray's agents are Python processes that take long to start on a loaded machine. Left to choose their own
# ports, they report them through files the raylet waits 15 s for, then aborts the whole node; with the
# ports given, the raylet does not wait. The register timeout covers the agents' later check-in.
AGENT_PORT_OPTIONS = (
    "--metrics-export-port",
    "--dashboard-agent-grpc-port",
    "--dashboard-agent-listen-port",
    "--runtime-env-agent-port",
)
AGENT_TIMEOUT_ENV = {"RAY_agent_register_timeout_ms": "180000"}
# A node that fails to start anyway is started again.
START_ATTEMPTS = 3
# Where `ray start` writes the address it serves on (in its temp dir).
ADDRESS_FILE = "ray_current_cluster"


class AgentPortWatcher(threading.Thread):
    """Lets a node start on a loaded machine. Ray's raylet waits at most 15 s (fixed, no option) for its
    dashboard agent to report the agent's HTTP port, and aborts the node when the agent is slower. Ray as
    `pip install ray` installs it (no aiohttp) runs the agent "minimal", without an HTTP server, and the
    agent reports -1 once it has imported its modules. This reports that same -1, through Ray's own
    function, as soon as a raylet under `ray start` appears; the agent writes it again later."""

    def __init__(self, ray_start_pid: int) -> None:
        super().__init__(name="cortex-ray-agent-port", daemon=True)
        self.ray_start_pid = ray_start_pid
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            import psutil
            from ray._private.utils import get_dashboard_dependency_error
            from ray._raylet import DASHBOARD_AGENT_LISTEN_PORT_NAME, persist_port
        except ImportError:
            return
        if get_dashboard_dependency_error() is None:  # a full agent runs an HTTP server: its real port counts
            return
        done: set[int] = set()
        while not self.stopped.wait(0.05):
            try:
                raylets = [
                    child
                    for child in psutil.Process(self.ray_start_pid).children(recursive=True)
                    if child.pid not in done and child.name() == "raylet"
                ]
            except psutil.Error:
                return
            for raylet in raylets:
                try:
                    options = dict(
                        arg[2:].split("=", 1)
                        for arg in raylet.cmdline()
                        if arg.startswith("--") and "=" in arg
                    )
                except psutil.Error:
                    continue
                if options.get("session_dir") and options.get("node_id"):
                    persist_port(
                        options["session_dir"], options["node_id"], DASHBOARD_AGENT_LISTEN_PORT_NAME, -1
                    )
                    done.add(raylet.pid)


def ray_command() -> str:
    """The `ray` CLI installed beside this Python."""
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else (shutil.which("ray") or "ray")


def ray_environment(auth_env: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Ray's processes (and so for every sub-job's actor): no credentials but Ray's
    own token (cluster_token.py), which every Ray process needs to reach the others."""
    env = scrubbed_environment()
    env.update(auth_env)
    for key, value in AGENT_TIMEOUT_ENV.items():
        env.setdefault(key, value)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def start_arguments(node: dict[str, Any], object_store_bytes: int | None) -> list[str]:
    """`ray start` arguments for a node's resources (registry.node_resources), with free ports for its agents."""
    arguments = [
        "--num-cpus",
        str(node["num_cpus"]),
        "--num-gpus",
        str(node["num_gpus"]),
        "--resources",
        json.dumps(node["resources"]),
        "--disable-usage-stats",
        # Ray's log monitor only copies workers' output to drivers; actors send theirs to the head.
        "--include-log-monitor",
        "false",
    ]
    for option in AGENT_PORT_OPTIONS:
        arguments += [option, str(free_port())]
    if object_store_bytes:
        arguments += ["--object-store-memory", str(object_store_bytes)]
    return arguments


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the backend dies, so `ray start --block` stops its processes."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class HeadFailed(RuntimeError):
    """The Ray head did not start."""


class RayHead:
    def __init__(
        self, process: subprocess.Popen, address: str, log_path: Path, temp_dir: Path | None = None
    ) -> None:
        self.process = process
        self.address = address
        self.log_path = log_path
        self.temp_dir = temp_dir
        self._log_offset = 0
        self._watcher = AgentPortWatcher(process.pid)

    @classmethod
    def launch(
        cls,
        node: dict[str, Any],
        port: int,
        object_store_bytes: int | None,
        temp_dir: Path,
        log_path: Path,
        bind_host: str,
        auth_env: dict[str, str],
    ) -> RayHead:
        """Start `ray start --head --block` (call this on the thread that lives as long as the backend:
        the kernel's parent-death signal follows the thread that started the child), listening on
        `bind_host` (confinement.py) and with `auth_env`'s authentication (cluster_token.py)."""
        bind_arguments, bind_env = head_binding(bind_host)
        command = [
            ray_command(),
            "start",
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
            "--block",
            "--temp-dir",
            str(temp_dir),
            *bind_arguments,
            *start_arguments(node, object_store_bytes),
        ]
        (temp_dir / ADDRESS_FILE).unlink(missing_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=ray_environment(auth_env, bind_env),
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        head = cls(process, "", log_path, temp_dir)
        head._log_offset = offset
        head._watcher = AgentPortWatcher(process.pid)
        head._watcher.start()
        return head

    def wait_ready(self, timeout_s: float = 180.0) -> str:
        """Block until the head answers; returns its address ("IP:PORT", what hosts join)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")[self._log_offset :]
            if READY_TEXT in text:
                address = self._address(text)
                if address:
                    self.address = address
                    self._watcher.stopped.set()
                    return self.address
            if self.process.poll() is not None:
                raise HeadFailed(
                    f"the Ray head did not start (exit code {self.process.returncode}); see {self.log_path}:\n"
                    f"{text[-2000:]}"
                )
            time.sleep(0.2)
        self.stop()
        raise HeadFailed(f"the Ray head did not start within {timeout_s:.0f} s; see {self.log_path}")

    def _address(self, text: str) -> str | None:
        """The address hosts join: Ray prints it, except on a single-machine cluster, where it only
        writes it into its temp dir."""
        match = ADDRESS_LINE.search(text)
        if match:
            return match.group(1)
        try:
            return (self.temp_dir / ADDRESS_FILE).read_text().strip() or None
        except OSError:
            return None

    @classmethod
    async def start(
        cls,
        node: dict[str, Any],
        port: int,
        object_store_bytes: int | None,
        temp_dir: Path,
        log_path: Path,
        bind_host: str,
        auth_env: dict[str, str],
    ) -> RayHead:
        """Launch the head and wait until it answers, trying again when Ray's start-up fails."""
        for attempt in range(1, START_ATTEMPTS + 1):
            head = cls.launch(node, port, object_store_bytes, temp_dir, log_path, bind_host, auth_env)
            try:
                await asyncio.to_thread(head.wait_ready)
                return head
            except HeadFailed as exc:
                await asyncio.to_thread(head.stop)
                if attempt == START_ATTEMPTS:
                    raise
                log.warning(
                    "%s; starting it again (attempt %d of %d)",
                    str(exc).splitlines()[0],
                    attempt + 1,
                    START_ATTEMPTS,
                )
        raise AssertionError("unreachable")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM (Ray stops its processes), then SIGKILL whatever of its session is left."""
        self._watcher.stopped.set()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
