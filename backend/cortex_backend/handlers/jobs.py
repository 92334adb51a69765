"""Jobs: create, list, read (with an optional long-poll for a status or progress change), cancel, and
complete ("Free device")."""

from __future__ import annotations

from .base import BaseHandler

MAX_PAGE = 500
MAX_WAIT_S = 60.0


class JobsHandler(BaseHandler):
    def get(self) -> None:
        query = self.query_args()
        page = self.service.jobs.list(self.principal, query.status, min(query.limit, MAX_PAGE), query.cursor)
        self.write_json(
            {
                "jobs": [self.service.job_views.render(job, self.principal) for job in page["jobs"]],
                "next_cursor": page["next_cursor"],
            }
        )

    def post(self) -> None:
        if self.replay_if_seen():
            return
        job = self.service.job_views.render(
            self.service.jobs.create(self.principal, self.parse_body()), self.principal
        )
        self.remember(201, job)
        self.write_json(job, 201)


class JobHandler(BaseHandler):
    async def get(self, job_id: str) -> None:
        query = self.query_args()
        job = await self.service.job_views.wait(
            self.principal, job_id, query.while_status, query.after_progress, min(query.wait, MAX_WAIT_S)
        )
        self.write_json(self.service.job_views.render(job, self.principal))


class JobCancelHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        self.write_json(
            self.service.job_views.render(self.service.jobs.cancel(self.principal, job_id), self.principal)
        )


class JobCompleteHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        job, saved = self.service.completion.complete(self.principal, job_id)
        self.write_json({**self.service.job_views.render(job, self.principal), "saved_checkpoint": saved})
