"""Job logs: every worker line, sequence-numbered and persisted, readable by cursor or followed live.

Any producer can append (workers through the executor, source runs, the service itself); readers page
after a cursor, long-poll for the next lines, or follow a stream. Retention is bounded per job: the
oldest lines are dropped and every read says how many were lost before its cursor. Lines shown to
someone other than the job's owner (an admin) have credential-looking text redacted.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.redaction import redact

from .store import Store
from .waiters import Waiters

MAX_PAGE = 5000


def run_log_key(run_id: str) -> str:
    """Where a source run's lines live: apart from job logs (job ids cannot hold ':'), so a job named
    like someone's run never reads that run's lines."""
    return f"run:{run_id}"


class LogBook:
    def __init__(self, store: Store, retention_lines: int) -> None:
        self.store = store
        self.retention_lines = retention_lines
        self.waiters = Waiters()
        self._appended: dict[str, int] = {}
        # Totals since start, for /metrics.
        self.lines_appended = 0
        self.lines_dropped = 0

    def append(self, job_id: str, sub_job_id: str, stream: str, lines: list[tuple[float, str]]) -> None:
        if not lines:
            return
        self.store.append_logs(job_id, [(sub_job_id, at, stream, line) for at, line in lines])
        self.lines_appended += len(lines)
        count = self._appended.get(job_id, 0) + len(lines)
        # Trim in batches, not per line: retention is a bound, not an exact count.
        if count >= max(1, self.retention_lines // 10):
            self.lines_dropped += self.store.trim_logs(job_id, self.retention_lines)
            count = 0
        self._appended[job_id] = count
        self.waiters.notify(job_id)

    def forget(self, job_id: str) -> None:
        """Drop the trim bookkeeping of a job that ended (its lines stay)."""
        self._appended.pop(job_id, None)

    def page(
        self, job_id: str, cursor: int, limit: int, sub_job_id: str | None = None, redacted: bool = False
    ) -> dict[str, Any]:
        limit = max(1, min(limit, MAX_PAGE))
        lines = self.store.read_logs(job_id, cursor, limit, sub_job_id)
        if redacted:
            for line in lines:
                line["line"] = redact(line["line"])
        first = self.store.first_log_seq(job_id)
        dropped = max(0, first - 1 - cursor) if first else 0
        next_cursor = lines[-1]["seq"] if lines else max(cursor, first - 1 if dropped else cursor)
        return {
            "lines": lines,
            "cursor": next_cursor,
            "dropped": dropped,
            "retention_lines": self.retention_lines,
        }

    async def follow(
        self,
        job_id: str,
        cursor: int,
        limit: int,
        wait_s: float,
        sub_job_id: str | None = None,
        redacted: bool = False,
    ) -> dict[str, Any]:
        """A page that waits up to `wait_s` for the first new line when none is there yet."""
        page = self.page(job_id, cursor, limit, sub_job_id, redacted)
        if page["lines"] or page["dropped"] or wait_s <= 0:
            return page
        await self.waiters.wait(job_id, wait_s)
        return self.page(job_id, cursor, limit, sub_job_id, redacted)
