"""Jobs: create, list, read (with an optional long-poll for a status change), cancel, complete."""

from __future__ import annotations

from ..jobs import public_job
from ..validation import validate_job_status
from .base import BaseHandler


class JobsHandler(BaseHandler):
    def get(self) -> None:
        status = validate_job_status(self.get_query_argument("status", None) or None)
        limit = self.int_argument("limit", 50, 1, 500)
        self.write_json(self.service.jobs.list(self.principal, status, limit, self.get_query_argument("cursor", None)))

    def post(self) -> None:
        if self.replay_if_seen():
            return
        job = public_job(self.service.jobs.create(self.principal, self.json_body()))
        self.remember(201, job)
        self.write_json(job, 201)


class JobHandler(BaseHandler):
    async def get(self, job_id: str) -> None:
        wait_s = self.float_argument("wait", 0.0)
        from_status = self.get_query_argument("while_status", None)
        job = await self.service.jobs.wait_for_change(self.principal, job_id, from_status, wait_s)
        self.write_json(public_job(job))


class JobCancelHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        self.write_json(public_job(self.service.jobs.cancel(self.principal, job_id)))


class JobCompleteHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        job = self.service.jobs.complete(self.principal, job_id, self.service.requests.has_active)
        self.write_json(public_job(job))
