"""Background threads that keep their output in the cell that started them.

Since ipykernel 7 a thread's output goes to whichever cell ran last unless the thread says otherwise
(ipykernel #1450/#1451, ipywidgets #4001/#4020). So the parent message is captured on the main
thread when a view is displayed, and each background thread adopts it for itself only
(`set_thread_parent`, which leaves other threads and the shell's default alone).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def capture_parent() -> Any:
    """The current cell's parent message (call on the main thread, at display); None outside a kernel."""
    shell = _shell()
    getter = getattr(shell, "get_parent", None)
    try:
        return getter() if getter is not None else None
    except Exception:  # a shell without a kernel behind it
        return None


def adopt_parent(parent: Any) -> None:
    """Route this thread's output to `parent`'s cell (no-op where the kernel has no per-thread parent)."""
    shell = _shell()
    setter = getattr(shell, "set_thread_parent", None)
    if parent and setter is not None:
        setter(parent)


def start_thread(target: Callable[[], None], name: str, parent: Any = None) -> threading.Thread:
    """A daemon thread (it never keeps a kernel from exiting) that adopts `parent` before running."""

    def run() -> None:
        adopt_parent(parent)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class BackgroundLoop:
    """A stoppable loop on one daemon thread that keeps its cell's parent. Subclasses write `_loop`,
    which runs until `self._closed` is set."""

    def __init__(self) -> None:
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def thread_name(self) -> str:
        return f"cortex-{type(self).__name__}"

    def start(self, parent: Any = None):
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self._thread = start_thread(self._loop, self.thread_name(), parent)
        return self

    def stop(self) -> None:
        self._closed.set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        raise NotImplementedError
