"""The control plane: create, list, read and cancel jobs; capacity. Jobs made here are ordinary jobs."""

from __future__ import annotations

from typing import Any

from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import parse
from cortex_nb.protocol.schemas.jobs import CreateJob

from ...jobs import public_job
from .base import CortexHandler
from .jobs import SDK_JOB_STATES, job_spec, sdk_job


class JobsHandler(CortexHandler):
    def get(self, database: str, schema: str) -> None:
        status = self.get_query_argument("status", None) or None
        ours = None
        if status is not None:
            ours = SDK_JOB_STATES.get(status.lower().removeprefix("job_state_"))
            if ours is None:
                raise ApiError(
                    "invalid_field",
                    f"status: {status!r} is not one of {sorted(SDK_JOB_STATES)}",
                    {"field": "status"},
                )
        jobs: list[dict[str, Any]] = []
        cursor = None
        while True:  # every page: the SDK lists without paging
            page = self.service.jobs.list(self.principal, ours, 500, cursor)
            jobs.extend(public_job(job) for job in page["jobs"])
            cursor = page.get("next_cursor")
            if not cursor or len(jobs) >= 5000:
                break
        self.write_json({"jobs": [sdk_job(job) for job in jobs]})

    def post(self, database: str, schema: str) -> None:
        job = self.service.jobs.create(
            self.principal, parse(CreateJob, job_spec(self.json_body(), database, schema))
        )
        self.write_json({"job_id": job["id"], "status": sdk_job(public_job(job))["status"]})


class JobHandler(CortexHandler):
    def get(self, database: str, schema: str, job_id: str) -> None:
        self.write_json(sdk_job(public_job(self.service.jobs.visible_job(self.principal, job_id))))


class JobCancelHandler(CortexHandler):
    def post(self, database: str, schema: str, job_id: str) -> None:
        job = self.service.jobs.cancel(self.principal, job_id)
        self.write_json({"job_id": job_id, "status": sdk_job(public_job(job))["status"]})


class CapacityHandler(CortexHandler):
    """Device slots reported in the SDK's GPU fields: a slot is where one sub-job runs."""

    def get(self, database: str, schema: str) -> None:
        capacity = self.service.scheduler.capacity()
        self.write_json(
            {
                "has_reservation": False,
                "max_total_gpus": capacity["slots_total"],
                "reserved_gpus": 0,
                "in_use_gpus": capacity["slots_in_use"],
                "pending_gpus": capacity.get("pending_slots", 0),
                "available_gpus": capacity["slots_available"],
                "devices": capacity["devices"],
            }
        )
