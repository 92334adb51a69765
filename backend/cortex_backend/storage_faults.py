"""When the store refuses a write: a full disk, or another process holding the database lock.

A worker's reports (log lines, request results, a training loop's progress) are applied on the IO loop.
One that fails on storage is held, with the same job's later reports behind it in order, and retried with
backoff; the reader that delivered it goes on reading. When storage has failed for `retry_s`, the job
fails with `storage_unavailable`, keeping what was committed, and its device slot is freed. A small
reserve file in the data dir is given up then, so that the failure itself can be recorded on a full disk.
An HTTP request whose write is refused answers `507 insufficient_storage` (disk full) or
`503 storage_unavailable` (locked), never `500 internal_error`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_nb.protocol.errors import ApiError

log = logging.getLogger("cortex_backend.storage")

FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# SQLite's primary result codes (the low byte of an extended code).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL = 5, 6, 13
# Held reports of one job kept at most; log lines beyond are dropped (and counted), other reports kept.
MAX_HELD_REPORTS = 20_000
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
RESERVE_BYTES = 8 << 20


def is_storage_error(exc: BaseException) -> bool:
    """A write refused by the disk or the database lock (not a bug of ours: worth retrying)."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    return isinstance(exc, OSError) and exc.errno in (FULL_ERRNOS | {errno.EIO, errno.EROFS})


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in FULL_ERRNOS
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        return (code is not None and code & 0xFF == SQLITE_FULL) or "disk is full" in str(exc)
    return False


def storage_api_error(exc: BaseException) -> ApiError | None:
    """The answer to an HTTP request whose write the store or the disk refused; None for other errors."""
    if is_disk_full(exc):
        return ApiError(
            "insufficient_storage",
            "the backend's disk is full, so nothing was kept; free space in its data dir and retry",
        )
    if is_storage_error(exc):
        return ApiError(
            "storage_unavailable",
            f"the backend's store refused the write ({exc}); nothing was kept, retry shortly",
        )
    return None


class StorageReserve:
    """A few MiB held in the data dir, given up on a full disk so that jobs failing for it can say so."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    def restore(self) -> None:
        """Hold the reserve again, when the disk has room well beyond it."""
        if self.path.exists():
            return
        try:
            disk = os.statvfs(self.path.parent)
            if disk.f_bavail * disk.f_frsize < 4 * self.size:
                return
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(descriptor, 0, self.size)
            finally:
                os.close(descriptor)
        except OSError:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def release(self) -> bool:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning("the data dir's disk is full: gave up the %d MiB storage reserve", self.size >> 20)
        return True


class HeldReports:
    """Executor reports applied in order per job, held and retried while storage refuses them."""

    def __init__(
        self,
        retry_s: float,
        give_up: Callable[[str, BaseException], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_s = retry_s
        self.give_up = give_up
        self.clock = clock
        self._held: dict[str, collections.deque] = {}
        self._failing_since: dict[str, float] = {}
        self._tasks: set[asyncio.Task] = set()
        # Totals since start, for logs and tests.
        self.retried = 0
        self.dropped_log_reports = 0
        self.jobs_failed = 0

    def held_jobs(self) -> list[str]:
        return list(self._held)

    def deliver(self, job_id: str, report: Callable[..., Any], *args: Any, droppable: bool = False) -> None:
        """Apply `report(*args)` now, or after the job's held reports. Never raises: the executor's reader
        that calls this must keep reading whatever a report meets."""
        held = self._held.get(job_id)
        if held is not None:
            if droppable and len(held) >= MAX_HELD_REPORTS:
                self.dropped_log_reports += 1
                return
            held.append((report, args))
            return
        try:
            report(*args)
        except Exception as exc:
            if not is_storage_error(exc):
                log.exception("a report about job %s failed; it was dropped", job_id)
                return
            log.warning(
                "the store refused a write for job %s (%s); holding its reports and retrying", job_id, exc
            )
            self._held[job_id] = collections.deque([(report, args)])
            self._failing_since[job_id] = self.clock()
            task = asyncio.ensure_future(self._retry(job_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def forget(self, job_id: str) -> None:
        """Drop what is held for a job that ended (its later reports would change nothing)."""
        self._held.pop(job_id, None)
        self._failing_since.pop(job_id, None)

    async def _retry(self, job_id: str) -> None:
        delay = RETRY_FIRST_S
        while (held := self._held.get(job_id)) is not None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            while held:
                report, args = held[0]
                self.retried += 1
                try:
                    report(*args)
                except Exception as exc:
                    if not is_storage_error(exc):
                        log.exception("a report about job %s failed; it was dropped", job_id)
                        held.popleft()
                        continue
                    if self.clock() - self._failing_since.get(job_id, self.clock()) >= self.retry_s:
                        self.forget(job_id)
                        self.jobs_failed += 1
                        self.give_up(job_id, exc)
                        return
                    break
                held.popleft()
                self._failing_since[job_id] = self.clock()
                delay = RETRY_FIRST_S
            if held is not None and not held and self._held.get(job_id) is held:
                self.forget(job_id)
                log.info("the store takes job %s's writes again", job_id)
                return

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
