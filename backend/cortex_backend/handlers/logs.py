"""Job logs: a page after a cursor, a long-poll (`wait`) that returns as soon as lines arrive, or a
follow stream (`follow=1`): newline-delimited JSON that stays open until the job ends.

Stream records: every log line as in a page plus "type": "line"; {"type": "dropped", "dropped",
"cursor"} when retention dropped lines past the cursor; {"type": "heartbeat", "cursor", "job_status"}
every HEARTBEAT_S of quiet (so proxies keep the connection and the client notices a dead one); and a
last {"type": "end", "cursor", "job_status"} when the job has ended and every line was sent. A client
that loses the connection resumes with `cursor` = the last seq it received.
"""

from __future__ import annotations

from typing import Any

from tornado.iostream import StreamClosedError

from cortex_nb.protocol import states
from cortex_nb.protocol.schemas.base import MAX_WAIT_S

from ..logs import MAX_PAGE
from ..validation import dumps_strict
from .base import BaseHandler

HEARTBEAT_S = 10.0
# After a job ends, wait this long for its workers' last lines before closing a stream.
END_GRACE_S = 0.25


class JobLogsHandler(BaseHandler):
    _connection_closed = False

    async def get(self, job_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        query = self.query_args()
        cursor, limit, sub_job = query.cursor, min(query.limit, MAX_PAGE), query.sub_job
        redacted = job["owner"] != self.principal.owner
        if (query.follow or "").lower() in ("1", "true", "yes"):
            self.waited = True
            await self._stream(job_id, cursor, sub_job, redacted, max(0.05, min(query.heartbeat, MAX_WAIT_S)))
            return
        wait_s = min(query.wait, MAX_WAIT_S) if job["status"] not in states.JOB_TERMINAL else 0.0
        self.waited = wait_s > 0
        page = await self.service.logs.follow(job_id, cursor, limit, wait_s, sub_job, redacted)
        page["job_status"] = self.service.jobs.visible_job(self.principal, job_id)["status"]
        self.write_json(page)

    def on_connection_close(self) -> None:
        self._connection_closed = True
        # A connection can close before routing gave the handler its path arguments.
        self.service.logs.waiters.notify(getattr(self, "path_kwargs", {}).get("job_id", ""))

    async def _stream(
        self, job_id: str, cursor: int, sub_job: str | None, redacted: bool, heartbeat_s: float
    ) -> None:
        logs, store = self.service.logs, self.service.store
        self.set_header("Content-Type", "application/x-ndjson; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        ending = False
        try:
            await self._send([])  # headers now: the client knows the stream is open
            while not self._connection_closed:
                page = logs.page(job_id, cursor, MAX_PAGE, sub_job, redacted)
                records: list[dict[str, Any]] = []
                if page["dropped"]:
                    # The cursor just past the gap: the lines that follow are still to be sent.
                    records.append(
                        {"type": "dropped", "dropped": page["dropped"], "cursor": cursor + page["dropped"]}
                    )
                records.extend({"type": "line", **line} for line in page["lines"])
                cursor = page["cursor"]
                if records:
                    await self._send(records)
                    continue
                status = store.get_job(job_id)["status"]
                if status in states.JOB_TERMINAL:
                    if ending:
                        await self._send([{"type": "end", "cursor": cursor, "job_status": status}])
                        break
                    ending = True
                    await logs.waiters.wait(job_id, END_GRACE_S)
                    continue
                if not await logs.waiters.wait(job_id, heartbeat_s):
                    await self._send([{"type": "heartbeat", "cursor": cursor, "job_status": status}])
        except StreamClosedError:
            return
        if not self._connection_closed:
            self.finish()

    async def _send(self, records: list[dict[str, Any]]) -> None:
        if records:
            self.write("".join(dumps_strict(record) + "\n" for record in records))
        await self.flush()
