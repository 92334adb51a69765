"""Numbered submissions (X-Cortex-Sequence: stream/n) run once each and in number order, whatever order
they arrive in and however often they are retried: what a client with parallel sends and fresh idempotency
keys on every retry (the Tinker SDK) needs."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from cortex_nb import Client, wire

from .reference import random_batch


def _post(backend, job_id: str, op: str, sequence: str, **kwargs) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {backend.token}",
        wire.SEQUENCE_HEADER: sequence,
        "Idempotency-Key": str(uuid.uuid4()),
        **kwargs.pop("headers", {}),
    }
    return httpx.post(f"{backend.url}/v1/jobs/{job_id}/{op}", headers=headers, timeout=30, **kwargs)


def _frame(seed: int, **overrides) -> bytes:
    batch = {**random_batch(np.random.default_rng(seed), 259, batch=2, length=8, pad_tail=False), **overrides}
    return wire.encode_frame(batch, {"loss_fn": "cross_entropy"})


FRAME = {"Content-Type": wire.FRAME_CONTENT_TYPE}


@pytest.fixture(scope="module")
def job(backend):
    """One job for the module; each test numbers its own stream."""
    with Client(backend.url, backend.token) as client:
        job = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=6)
        job.wait_ready()
        yield job
        job.cancel()


def test_an_early_number_waits_for_the_ones_before_it(backend, client: Client, job):
    # The step (2) arrives before the forward_backward (1) it needs: it waits instead of failing with no_gradients.
    step = _post(backend, job.job_id, "step", "waits/2", json={})
    assert step.status_code == 202
    waiting = client.get_request_status(job.job_id, step.json()["request_id"])
    assert waiting["status"] == "queued"
    assert any(event["type"] == "waiting_for_sequence" for event in waiting["events"])
    first = _post(backend, job.job_id, "forward_backward", "waits/1", content=_frame(1), headers=FRAME)
    assert first.status_code == 202
    assert client.poll_request(job.job_id, step.json()["request_id"])["step"] == 1
    done = client.get_request_status(job.job_id, step.json()["request_id"])
    forward_backward = client.get_request_status(job.job_id, first.json()["request_id"])
    assert forward_backward["finished_at"] <= done["started_at"]


def test_a_retried_number_runs_once(backend, client: Client, job):
    first = _post(backend, job.job_id, "forward_backward", "retried/1", content=_frame(2), headers=FRAME)
    again = _post(backend, job.job_id, "forward_backward", "retried/1", content=_frame(2), headers=FRAME)
    assert first.status_code == again.status_code == 202
    assert first.json()["request_id"] == again.json()["request_id"]
    client.poll_request(job.job_id, first.json()["request_id"])
    assert [r["request_id"] for r in client.list_requests(job.job_id)].count(first.json()["request_id"]) == 1
    assert client.get_request_status(job.job_id, first.json()["request_id"])["status"] == "succeeded"
    # Streams are independent of each other.
    other = _post(backend, job.job_id, "forward_backward", "other-stream/1", content=_frame(3), headers=FRAME)
    assert other.json()["request_id"] != first.json()["request_id"]


def test_a_refused_number_is_used_up_and_refused_again_on_retry(backend, client: Client, job):
    bad = _frame(4, weights=np.full((2, 8), np.nan, dtype=np.float32))
    refused = _post(backend, job.job_id, "forward_backward", "refused/1", content=bad, headers=FRAME)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_batch"
    # The next number does not wait for the refused one.
    after = _post(backend, job.job_id, "forward_backward", "refused/2", content=_frame(5), headers=FRAME)
    assert client.poll_request(job.job_id, after.json()["request_id"])["loss"] > 0
    retried = _post(backend, job.job_id, "forward_backward", "refused/1", content=bad, headers=FRAME)
    assert retried.status_code == 400 and retried.json()["error"]["code"] == "invalid_batch"


def test_bad_sequence_values_are_named(backend, job):
    for value in ["bad/0", "bad/-1", "bad", "/3", "bad/5000", "a b/1"]:
        response = _post(backend, job.job_id, "step", value, json={})
        assert response.status_code == 400, value
        error = response.json()["error"]
        assert error["code"] == "invalid_field" and error["detail"]["field"] in (
            wire.SEQUENCE_HEADER,
            "sequence",
        ), value
