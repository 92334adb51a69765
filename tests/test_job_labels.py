"""Jobs carry free-form labels (shown in `%cortex jobs`, never an access rule), and idle_timeout_s=0
keeps a job from being completed for idleness."""

from __future__ import annotations

import httpx
import pytest

from cortex_nb import errors
from cortex_nb.views import jobs_frame

from .notebook_fixtures import wait_until
from .tokens import create_token


def test_labels_are_recorded_shown_and_validated(backend, client):
    labels = {"database": "TRAINING_DB", "schema": "PUBLIC"}
    job = client._call(
        "create_job", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}], "labels": labels}
    )
    try:
        assert client.get_job(job["job_id"])["labels"] == labels
        listed = next(j for j in client.list_jobs(limit=500) if j["job_id"] == job["job_id"])
        row = jobs_frame([listed]).iloc[0]
        assert row["labels"] == "database=TRAINING_DB, schema=PUBLIC"
        # Labels are no access boundary: another owner still cannot see the job.
        other = create_token(backend.data_dir, "label-reader", "jobs:read")
        response = httpx.get(
            f"{backend.url}/v1/jobs/{job['job_id']}", headers={"Authorization": f"Bearer {other}"}
        )
        assert response.status_code == 404
    finally:
        client.cancel_job(job["job_id"])
    for bad, field in (
        ({"Database": "x"}, "labels.Database"),
        ({"schema": 3}, "labels.schema"),
        ("db", "labels"),
    ):
        with pytest.raises(errors.BadRequestError) as caught:
            client._call(
                "create_job", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}], "labels": bad}
            )
        assert caught.value.detail["field"] == field


def test_zero_idle_timeout_means_never(client):
    """idle_timeout_s 0 keeps a job up however long it has nothing to do; a short one frees its device."""
    sampler = [{"type": "sampling", "base_model": "tiny"}]
    never = client.create_job(sampler, name="never-idles", idle_timeout_s=0)
    brief = client.create_job(sampler, name="idles-briefly", idle_timeout_s=1)
    try:
        wait_until(lambda: client.get_job(brief["job_id"])["status"] == "done", 120)
        never = client.wait_for_job(never["job_id"])
        assert never["status"] == "running" and never["idle"] is None  # nothing to count down
    finally:
        client.cancel_job(never["job_id"])
