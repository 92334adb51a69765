"""Job logs: a page after a cursor, or (with `follow`) a long-poll that returns as soon as lines arrive."""

from __future__ import annotations

from cortex_nb import states

from .base import BaseHandler


class JobLogsHandler(BaseHandler):
    async def get(self, job_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        cursor = self.int_argument("cursor", 0)
        limit = self.int_argument("limit", 1000, 1, 5000)
        sub_job = self.get_query_argument("sub_job", None) or None
        wait_s = self.float_argument("wait", 0.0) if job["status"] not in states.JOB_TERMINAL else 0.0
        page = await self.service.logs.follow(job_id, cursor, limit, wait_s, sub_job)
        page["job_status"] = self.service.jobs.visible_job(self.principal, job_id)["status"]
        self.write_json(page)
