"""An actor's stdout and stderr as its sub-job's log lines.

The local executor reads a worker's pipes from the backend; an actor's process is on another host, so
the actor reads its own: file descriptors 1 and 2 are pointed at pipes, and a thread per stream turns
what arrives into timestamped lines, sent to the head with the actor's other messages (so they arrive
in order with them). Everything is also written on to the original descriptors, Ray's log files on the
host, where an operator finds a native crash's last words that never reached the head.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

# Lines Ray itself prints into a worker's streams to attribute them in its own log files.
RAY_MARKERS = (":actor_name:", ":task_name:", ":job_id:")
READ_BYTES = 1 << 16
MAX_LINE_BYTES = 1 << 16

Emit = Callable[[str, list[tuple[float, str]]], None]


class OutputCapture:
    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self._threads: list[threading.Thread] = []
        self._originals: dict[int, int] = {}

    def start(self) -> None:
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            self._originals[fd] = os.dup(fd)
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(
                target=self._pump,
                args=(read_end, self._originals[fd], stream),
                name=f"cortex-capture-{stream}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _pump(self, read_end: int, original: int, stream: str) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(read_end, READ_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                break
            try:
                os.write(original, chunk)
            except OSError:
                pass
            pending += chunk
            *complete, pending = pending.split(b"\n")
            if len(pending) > MAX_LINE_BYTES:  # a line without end: pass on what is there
                complete.append(pending)
                pending = b""
            self._send(stream, complete)
        if pending:
            self._send(stream, [pending])

    def _send(self, stream: str, raw_lines: list[bytes]) -> None:
        at = time.time()
        lines = [(at, raw.decode("utf-8", errors="replace").rstrip("\r")) for raw in raw_lines]
        lines = [(at, line) for at, line in lines if not line.startswith(RAY_MARKERS)]
        if lines:
            self.emit(stream, lines)
