"""Jobs: create, list, read (with an optional long-poll for a status or progress change), rename and
label, delete (once ended), cancel, complete ("Free device"), and a job's lineage."""

from __future__ import annotations

from cortex_nb.protocol.schemas.base import MAX_WAIT_S

from ..listings import listing_filter
from .base import BaseHandler

MAX_PAGE = 500


class JobsHandler(BaseHandler):
    def get(self) -> None:
        query = self.query_args()
        page = self.service.jobs.list(
            self.principal,
            query.status,
            min(query.limit, MAX_PAGE),
            query.cursor,
            listing_filter(self.principal, query),
        )
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

    def patch(self, job_id: str) -> None:
        job = self.service.jobs.update(self.principal, job_id, self.parse_body())
        self.write_json(self.service.job_views.render(job, self.principal))

    def delete(self, job_id: str) -> None:
        self.write_json(self.service.checkpoint_storage.delete_job(self.principal, job_id))


class JobLineageHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        self.write_json(self.service.lineage.of_job(self.principal, job_id))


class JobCancelHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        self.write_json(
            self.service.job_views.render(self.service.jobs.cancel(self.principal, job_id), self.principal)
        )


class JobCompleteHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        job, saved = self.service.completion.complete(self.principal, job_id)
        self.write_json({**self.service.job_views.render(job, self.principal), "saved_checkpoint": saved})
