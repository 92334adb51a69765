"""Jobs: create, list, read (with an optional long-poll for a status or progress change), cancel, and
complete ("Free device")."""

from __future__ import annotations

from cortex_nb.errors import ApiError

from ..validation import validate_job_status
from .base import BaseHandler


class JobsHandler(BaseHandler):
    def get(self) -> None:
        status = validate_job_status(self.get_query_argument("status", None) or None)
        limit = self.int_argument("limit", 50, 1, 500)
        page = self.service.jobs.list(self.principal, status, limit, self.get_query_argument("cursor", None))
        self.write_json({"jobs": [self.service.job_views.render(job, self.principal) for job in page["jobs"]],
                         "next_cursor": page["next_cursor"]})

    def post(self) -> None:
        if self.replay_if_seen():
            return
        job = self.service.job_views.render(self.service.jobs.create(self.principal, self.json_body()), self.principal)
        self.remember(201, job)
        self.write_json(job, 201)


class JobHandler(BaseHandler):
    async def get(self, job_id: str) -> None:
        wait_s = self.float_argument("wait", 0.0)
        job = await self.service.job_views.wait(self.principal, job_id, self.get_query_argument("while_status", None),
                                                self._timestamp("after_progress"), wait_s)
        self.write_json(self.service.job_views.render(job, self.principal))

    def _timestamp(self, name: str) -> float | None:
        raw = self.get_query_argument(name, None)
        if raw in (None, ""):
            return None
        try:
            return float(raw)
        except ValueError:
            raise ApiError("invalid_field", f"{name}: must be a number (a progress updated_at), got {raw!r}",
                           {"field": name}) from None


class JobCancelHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        self.write_json(self.service.job_views.render(self.service.jobs.cancel(self.principal, job_id), self.principal))


class JobCompleteHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        job, saved = self.service.completion.complete(self.principal, job_id)
        self.write_json({**self.service.job_views.render(job, self.principal), "saved_checkpoint": saved})
