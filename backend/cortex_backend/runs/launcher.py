"""Starting, watching and stopping one run's sandbox supervisor (runs/sandbox.py) from the IO loop.

The supervisor's stdout and stderr are the run's own output (it hands them to the command); its
status pipe carries JSON events. Stopping sends SIGTERM (the supervisor gives the run its grace
period, then kills everything); if the supervisor itself does not end in time, its process group is
killed, which also ends the run's PID namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("cortex_backend.runs")

SANDBOX_PROGRAM = str(Path(__file__).with_name("sandbox.py"))
LINE_LIMIT = 1 << 16
FLUSH_S = 0.1


@dataclass
class SandboxResult:
    """How the sandbox ended: one of `setup_failure`, or the command's exit."""

    isolation: dict[str, str] | None = None
    exit_code: int | None = None
    signal: int | None = None
    max_rss_bytes: int = 0
    cpu_seconds: float = 0.0
    stopped: bool = False
    error: str | None = None
    # "disk" or "memory" when the supervisor ended the run for passing a limit it watches.
    limit_exceeded: str | None = None
    setup_failure: tuple[str, str] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


def launcher_environment() -> dict[str, str]:
    """The supervisor's own environment: only what Python needs to start (the run's env is in its config)."""
    keep = ("PATH", "LANG", "LC_ALL")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class SandboxProcess:
    def __init__(
        self,
        config_path: Path,
        on_output: Callable[[str, list[tuple[float, str]]], None],
        on_started: Callable[[dict[str, Any]], None],
        kill_grace_s: float,
    ) -> None:
        self.config_path = config_path
        self.on_output = on_output
        self.on_started = on_started
        self.kill_grace_s = kill_grace_s
        self.process: asyncio.subprocess.Process | None = None
        self.result = SandboxResult()
        self._tasks: list[asyncio.Task] = []
        self._pending: list[tuple[str, float, str]] = []
        self._stopping: asyncio.TimerHandle | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self.process = await asyncio.create_subprocess_exec(
                # By path, isolated and without site: it needs only the standard library, and importing the
                # packages would cost most of a second per run.
                sys.executable,
                "-I",
                "-S",
                SANDBOX_PROGRAM,
                str(self.config_path),
                str(write_fd),
                pass_fds=(write_fd,),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=launcher_environment(),
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        status_reader = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status_reader), os.fdopen(read_fd, "rb")
        )
        self._tasks = [
            asyncio.create_task(self._read_events(status_reader)),
            asyncio.create_task(self._read_stream(self.process.stdout, "stdout")),
            asyncio.create_task(self._read_stream(self.process.stderr, "stderr")),
        ]
        self._flusher = asyncio.create_task(self._flush_periodically())

    async def wait(self) -> SandboxResult:
        assert self.process is not None
        await self.process.wait()
        # The readers end when every holder of the pipes is gone; a straggler must not hang the run.
        _, stragglers = await asyncio.wait(self._tasks, timeout=5.0)
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._flusher
        self._flush()
        if self._stopping is not None:
            self._stopping.cancel()
        return self.result

    def stop(self) -> None:
        """Ask the supervisor to stop the run; kill it outright if it has not ended after the grace period."""
        if self.process is None or self.process.returncode is not None or self._stopping is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        self._stopping = asyncio.get_running_loop().call_later(self.kill_grace_s + 5.0, self._kill)

    def _kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            log.warning("run sandbox %s did not stop in time; killing its process group", self.process.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    # reading -------------------------------------------------------------------------------------
    async def _read_events(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:
                raw = await reader.read(LINE_LIMIT)
            if not raw:
                return
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            self._on_event(event)

    def _on_event(self, event: dict[str, Any]) -> None:
        result = self.result
        result.events.append(event)
        kind = event.get("event")
        if kind == "started":
            result.isolation = event.get("isolation")
            self.on_started(event)
        elif kind == "exit":
            result.exit_code = event.get("exit_code")
            result.signal = event.get("signal")
            result.max_rss_bytes = int(event.get("max_rss_bytes") or 0)
            result.cpu_seconds = float(event.get("cpu_seconds") or 0.0)
            result.stopped = bool(event.get("stopped"))
            result.error = event.get("error")
            result.limit_exceeded = event.get("limit_exceeded")
        elif (
            kind == "setup_failed"
            and result.setup_failure is None
            and result.exit_code is None
            and result.signal is None
        ):
            result.setup_failure = (
                str(event.get("code") or "sandbox_failed"),
                str(event.get("message") or ""),
            )

    async def _read_stream(self, stream: asyncio.StreamReader, name: str) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the stream limit: take what is there
                raw = await stream.read(LINE_LIMIT)
            if not raw:
                return
            self._pending.append((name, time.time(), raw.decode("utf-8", errors="replace").rstrip("\n")))

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._flush()

    def _flush(self) -> None:
        """Hand buffered lines over in batches per stream (one store write per batch, not per line)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        batch: list[tuple[float, str]] = []
        stream = pending[0][0]
        for name, at, line in pending:
            if name != stream and batch:
                self.on_output(stream, batch)
                batch = []
            stream = name
            batch.append((at, line))
        if batch:
            self.on_output(stream, batch)
