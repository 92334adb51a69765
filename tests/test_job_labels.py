"""Jobs carry free-form labels (shown in `%cortex jobs`, never an access rule), and idle_timeout_s=0
keeps a job from being completed for idleness."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from cortex_backend.jobs import JobManager
from cortex_backend.store import Store

from cortex_nb import errors
from cortex_nb.views import jobs_frame

from .tokens import create_token


def test_labels_are_recorded_shown_and_validated(backend, client):
    labels = {"database": "TRAINING_DB", "schema": "PUBLIC"}
    job = client._call("create_job", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}], "labels": labels})
    try:
        assert client.get_job(job["job_id"])["labels"] == labels
        listed = next(j for j in client.list_jobs(limit=500) if j["job_id"] == job["job_id"])
        row = jobs_frame([listed]).iloc[0]
        assert row["labels"] == "database=TRAINING_DB, schema=PUBLIC"
        # Labels are no access boundary: another owner still cannot see the job.
        other = create_token(backend.data_dir, "label-reader", "jobs:read")
        response = httpx.get(f"{backend.url}/v1/jobs/{job['job_id']}", headers={"Authorization": f"Bearer {other}"})
        assert response.status_code == 404
    finally:
        client.cancel_job(job["job_id"])
    for bad, field in (({"Database": "x"}, "labels.Database"), ({"schema": 3}, "labels.schema"), ("db", "labels")):
        with pytest.raises(errors.BadRequestError) as caught:
            client._call("create_job", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}], "labels": bad})
        assert caught.value.detail["field"] == field


class _NoWorkers:
    """The sweep only decides which jobs end; nothing runs here."""

    async def stop_sub_job(self, job_id, sub_job_id):
        return None


def test_zero_idle_timeout_means_never(tmp_path):
    store = Store(tmp_path / "db.sqlite3")

    class _Scheduler:
        def release(self, job_id):
            return True

        def admit(self):
            return []

    jobs = JobManager(store, None, _Scheduler(), _NoWorkers(), default_idle_timeout_s=3600)
    for job_id, timeout in (("job-never", 0), ("job-brief", 5)):
        spec = {"sub_jobs": [{"type": "sampling", "base_model": "tiny"}], "idle_timeout_s": timeout}
        store.insert_job({"id": job_id, "owner": "alice", "status": "running", "spec": spec},
                         [{"id": "sampling-0", "type": "sampling", "status": "running", "spec": spec["sub_jobs"][0]}])
        store.update_job(job_id, last_activity_at=time.time() - 3600)

    async def sweep():
        jobs.sweep_idle()
        await asyncio.sleep(0)

    asyncio.run(sweep())
    assert store.get_job("job-never")["status"] == "running"
    assert store.get_job("job-brief")["status"] == "done"
