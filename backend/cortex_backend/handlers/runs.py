"""Source runs: submit, list, read (optionally long-polling a status change), cancel, logs, report,
outputs (listing and download), and the chunk uploads that carry a run's source archive."""

from __future__ import annotations

from cortex_nb.protocol import states
from cortex_nb.protocol.schemas.base import MAX_WAIT_S

from ..listings import listing_filter
from ..logs import MAX_PAGE, run_log_key
from ..runs.manager import public_run
from .base import BaseHandler
from .uploads import UploadChunkHandler

OUTPUT_BLOCK = 1 << 20


class RunsHandler(BaseHandler):
    def get(self) -> None:
        query = self.query_args()
        self.write_json(
            self.service.runs.list(
                self.principal,
                query.status,
                min(query.limit, 500),
                query.cursor,
                query.submission_id,
                listing_filter(self.principal, query),
            )
        )

    async def post(self) -> None:
        run, created = await self.service.runs.submit(self.principal, self.parse_body())
        if not created:
            self.set_header("Cortex-Existing-Run", "true")
        self.write_json(public_run(run), 201 if created else 200)


class RunHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        query = self.query_args()
        self.write_json(
            public_run(
                await self.service.runs.wait_for_change(
                    self.principal, run_id, query.while_status, min(query.wait, MAX_WAIT_S)
                )
            )
        )


class RunCancelHandler(BaseHandler):
    def post(self, run_id: str) -> None:
        self.write_json(public_run(self.service.runs.cancel(self.principal, run_id)))


class RunReportHandler(BaseHandler):
    def get(self, run_id: str) -> None:
        self.write_json(self.service.runs.report(self.principal, run_id))


class RunLogsHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        run = self.service.runs.visible_run(self.principal, run_id)
        query = self.query_args()
        wait_s = min(query.wait, MAX_WAIT_S) if run["status"] not in states.JOB_TERMINAL else 0.0
        # Lines shown to anyone but the run's owner (an admin) are redacted, as job logs are.
        redacted = run["owner"] != self.principal.owner
        page = await self.service.logs.follow(
            run_log_key(run_id), query.cursor, min(query.limit, MAX_PAGE), wait_s, redacted=redacted
        )
        page["run_status"] = self.service.runs.visible_run(self.principal, run_id)["status"]
        self.write_json(page)


class RunOutputsHandler(BaseHandler):
    def get(self, run_id: str) -> None:
        self.write_json(self.service.runs.outputs(self.principal, run_id))


class RunOutputHandler(BaseHandler):
    """The stored bytes of one output, as collected; the client checks them against the recorded hash."""

    async def get(self, run_id: str, name: str) -> None:
        path, record = self.service.runs.output_file(self.principal, run_id, name)
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.set_header("X-Cortex-Sha256", record["sha256"])
        self.set_header("X-Cortex-Output-Path", record["path"])
        with open(path, "rb") as handle:
            while True:
                block = handle.read(OUTPUT_BLOCK)
                if not block:
                    break
                self.write(block)
                await self.flush()
        self.finish()


class RunUploadChunkHandler(UploadChunkHandler):
    """Same chunk store as data-plane uploads, under the runs:write scope."""
