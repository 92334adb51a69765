"""Batching view updates: many state changes, at most a few renders a second, off the main thread."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..kernel_threads import start_thread

MAX_RENDERS_PER_S = 4.0


class RenderThrottle:
    """Calls `render` on a background thread whenever `mark_dirty` was called since the last render,
    never more than `max_per_s` times a second. `render` may return a number of seconds: the view
    changes by itself then (a relative time, a countdown), and it is rendered again at that time even
    if nothing was marked. The thread ends once `is_finished()` holds after a render that asked for no
    such refresh, and starts again if marked dirty later."""

    def __init__(
        self,
        render: Callable[[], float | None],
        is_finished: Callable[[], bool],
        max_per_s: float = MAX_RENDERS_PER_S,
        parent: Any = None,
    ) -> None:
        self.render = render
        self.is_finished = is_finished
        self.min_interval_s = 1.0 / max_per_s
        self.parent = parent
        self.renders = 0
        self.render_times: deque[float] = deque(maxlen=64)
        self.last_error: str | None = None
        self._dirty = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._refresh_at: float | None = None

    def mark_dirty(self) -> None:
        with self._lock:
            self._dirty.set()
            if self._thread is None and not self._closed.is_set():
                self._thread = start_thread(self._loop, "cortex-render", self.parent)

    def close(self) -> None:
        self._closed.set()
        self._dirty.set()

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until no render is pending (tests and the blocking paths use this)."""
        deadline = time.monotonic() + timeout_s
        while self._dirty.is_set() and not self._closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self.is_finished():
            thread.join(max(0.0, deadline - time.monotonic()))

    def _exit_if_finished(self) -> bool:
        """Under the lock, so a `mark_dirty` racing with the exit starts a fresh thread."""
        with self._lock:
            idle = self._refresh_at is None and not self._dirty.is_set()
            if self._closed.is_set() or (idle and self.is_finished()):
                self._thread = None
                return True
            return False

    def _loop(self) -> None:
        while True:
            due_in = 1.0 if self._refresh_at is None else min(1.0, self._refresh_at - time.monotonic())
            if not self._dirty.wait(max(0.0, due_in)):
                refresh_due = self._refresh_at is not None and time.monotonic() >= self._refresh_at
                if not refresh_due:
                    if self._exit_if_finished():
                        return
                    continue
            if self._closed.is_set():
                with self._lock:
                    self._thread = None
                return
            self._dirty.clear()
            started = time.monotonic()
            refresh_in = None
            try:
                refresh_in = self.render()
            except Exception as exc:  # a view glitch must not kill updates for the rest of the run
                self.last_error = f"{type(exc).__name__}: {exc}"
            self._refresh_at = None if refresh_in is None else started + max(refresh_in, self.min_interval_s)
            self.renders += 1
            self.render_times.append(started)
            if self._exit_if_finished():
                return
            self._closed.wait(max(0.0, self.min_interval_s - (time.monotonic() - started)))
