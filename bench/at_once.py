"""Run several clients' work at the same moment, for benches that measure aggregate throughput."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def run_at_once(calls: list[Callable[[], Any]]) -> tuple[float, list[Any]]:
    """Each call on a thread of its own, all released together: the seconds until the last ends, and their
    results in order. Timing starts once every thread is ready, so thread start-up is not counted."""
    go = threading.Barrier(len(calls) + 1)
    results: list[Any] = [None] * len(calls)

    def client(index: int) -> None:
        go.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=client, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    go.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, results
