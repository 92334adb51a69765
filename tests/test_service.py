"""Service behaviour: tokens stored hashed, queueing for devices, capacity, job lifecycle, idle timeout."""

from __future__ import annotations

import stat
import time

import httpx
import numpy as np
import pytest

from cortex_nb import Client, errors

from .backend_process import start_backend
from .reference import random_batch
from .tokens import create_token


@pytest.fixture(scope="module")
def one_slot_backend(tmp_path_factory):
    process = start_backend(tmp_path_factory.mktemp("one-slot"), "--devices", "cpu:1", "--idle-timeout", "3")
    yield process
    process.stop()


def test_tokens_are_stored_hashed_and_the_admin_token_is_private(one_slot_backend):
    data_dir = one_slot_backend.data_dir
    mode = stat.S_IMODE((data_dir / "admin.token").stat().st_mode)
    assert mode == 0o600
    token = create_token(data_dir, "carol", "jobs:read")
    assert token.startswith("ctx_") and len(token) > 30
    for path in data_dir.glob("cortex.sqlite3*"):
        assert token.encode() not in path.read_bytes()
        assert one_slot_backend.token.encode() not in path.read_bytes()
    with Client(one_slot_backend.url, token) as carol:
        assert carol.whoami() == {
            "owner": "carol",
            "token_id": carol.whoami()["token_id"],
            "scopes": ["jobs:read"],
        }


def slots_in_use_once_workers_exit(client: Client, timeout_s: float = 30.0) -> int:
    """Slots in use once ended jobs' workers have exited (a slot is freed then, not when a job ends)."""
    deadline = time.monotonic() + timeout_s
    while client.get_capacity()["slots_in_use"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.get_capacity()["slots_in_use"]


def test_a_job_that_does_not_fit_queues_until_a_device_frees(one_slot_backend):
    with Client(one_slot_backend.url, one_slot_backend.token) as client:
        first = client.create_training_job("tiny", idle_timeout_s=600)
        second = client.create_training_job("tiny", wait=False)
        assert second.status == "pending"
        capacity = client.get_capacity()
        assert capacity["slots_in_use"] == 1 and capacity["pending"] == 1 and capacity["slots_available"] == 0
        # Requests sent to a pending job wait for it and then run.
        queued = second.forward_backward(random_batch(np.random.default_rng(0), 259, 1, 8))
        first.complete()
        assert client.wait_for_job(second.job_id, ("running",), timeout_s=120)["status"] == "running"
        assert queued.result()["loss"] > 0
        second.cancel()
        # The slot is free once the cancelled job's worker has exited (moments later), not at the cancel.
        assert slots_in_use_once_workers_exit(client) == 0
        with pytest.raises(errors.BadRequestError) as info:
            client.create_training_job("tiny", samplers=1)
        assert info.value.code == "exceeds_capacity"


def test_cancel_is_idempotent_and_complete_finishes_queued_work(one_slot_backend):
    with Client(one_slot_backend.url, one_slot_backend.token) as client:
        job = client.create_training_job("tiny", idle_timeout_s=600)
        fb = job.forward_backward(random_batch(np.random.default_rng(0), 259, 2, 16))
        step = job.step()
        assert job.complete()["status"] in ("running", "done")
        assert step.result()["step"] == 1 and fb.result()["loss"] > 0  # queued work ran before the job ended
        assert client.wait_for_job(job.job_id, ("done",), timeout_s=30)["status"] == "done"
        with pytest.raises(errors.ConflictError):
            job.step()
        other = client.create_training_job("tiny", wait=False)
        assert client.cancel_job(other.job_id)["status"] == "cancelled"
        assert client.cancel_job(other.job_id)["status"] == "cancelled"
        assert client.cancel_job(job.job_id)["status"] == "done"  # cancelling a finished job changes nothing


def test_an_idle_job_is_completed_and_frees_its_device(one_slot_backend):
    with Client(one_slot_backend.url, one_slot_backend.token) as client:
        job = client.create_training_job("tiny")  # the backend was started with --idle-timeout 3
        deadline = time.monotonic() + 60
        while job.status != "done" and time.monotonic() < deadline:
            time.sleep(1)
        assert job.info["status"] == "done"
        assert slots_in_use_once_workers_exit(client) == 0


def test_list_jobs_pages_with_a_cursor(backend, client):
    made = [
        client.create_job([{"type": "sampling", "base_model": "tiny"}], name=f"page-{i}") for i in range(3)
    ]
    headers = {"Authorization": f"Bearer {backend.token}"}
    page = httpx.get(f"{backend.url}/v1/jobs", params={"limit": 2}, headers=headers).json()
    assert len(page["jobs"]) == 2 and page["next_cursor"]
    rest = httpx.get(
        f"{backend.url}/v1/jobs", params={"limit": 2, "cursor": page["next_cursor"]}, headers=headers
    ).json()
    assert not {j["job_id"] for j in page["jobs"]} & {j["job_id"] for j in rest["jobs"]}
    assert [j["job_id"] for j in page["jobs"]] == [made[2]["job_id"], made[1]["job_id"]]  # newest first
    for job in made:
        client.cancel_job(job["job_id"])
    cancelled = {j["job_id"] for j in client.list_jobs(status="cancelled", limit=500)}
    assert {job["job_id"] for job in made} <= cancelled


def test_models_and_capacity_describe_the_host(client):
    models = {m["name"]: m for m in client.list_models()}
    assert models["tiny"]["kind"] == "builtin" and models["tiny"]["vocab_size"] == 259
    assert (
        models["small-gpt2"]["kind"] == "local" and models["small-gpt2"]["architecture"] == "GPT2LMHeadModel"
    )
    capacity = client.get_capacity()
    assert capacity["devices"][0]["kind"] == "cpu" and capacity["slots_total"] == 8
