"""Codes of the error table that no other test reaches, each produced by a real backend and asserted.

Most are answers to bad input; the failures a healthy host never shows on demand (an unexpected error in
an operation, a device out of memory, a training loop that breaks, a sync whose full weights arrive
damaged) come from a backend of this module's own started with `--fault-injection` (faults.py).
tests/test_error_codes.py checks that every code of the table is asserted by some test.
"""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from cortex_training import serialize_forward_backward_args
from cortex_training import wire as sdk_wire

from cortex_nb import Client, RequestFailed, TimeoutError
from cortex_nb.demo_data import addition_problems
from cortex_nb.protocol.states import JOB_FAILED

from .backend_process import start_backend
from .model_factory import build_gpt2_dir
from .tokens import create_token
from .training_data import text_batch


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """A backend whose workers misbehave in named ways, a model whose weights are damaged, and Tinker
    sessions that end after one second without a heartbeat."""
    broken = build_gpt2_dir(tmp_path_factory.mktemp("models") / "broken-gpt2")
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file" * 10)
    process = start_backend(
        tmp_path_factory.mktemp("faulty-backend"),
        "--model",
        f"broken-gpt2={broken}",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
        "--tinker-session-timeout",
        "1",
        "--fault-injection",
        "fail_forward_backward",
        "--fault-injection",
        "oom_forward",
        "--fault-injection",
        "fail_training_loop",
        "--fault-injection",
        "corrupt_sync_full=sampling-0",
    )
    yield process
    process.stop()


@pytest.fixture
def faulty_client(faulty):
    with Client(faulty.url, faulty.token) as client:
        yield client


def test_unknown_runs_are_not_found(backend):
    headers = {"Authorization": f"Bearer {backend.token}"}
    missing = httpx.get(backend.url + "/v1/runs/run-0000000000", headers=headers)
    assert error_of(missing, 404)["code"] == "run_not_found"


def test_a_local_wait_that_runs_out_says_timeout_and_leaves_the_job_running(client):
    with client.create_training_job("tiny") as job:
        with pytest.raises(TimeoutError) as caught:
            client.wait_for_job(job.job_id, until=("done",), timeout_s=0.3)
        assert caught.value.code == "timeout"
        assert client.get_job(job.job_id)["status"] in ("queued", "starting", "running")


def test_an_unexpected_error_or_running_out_of_memory_fails_that_request_only(faulty, faulty_client):
    with faulty_client.create_training_job("tiny") as job:
        with pytest.raises(RequestFailed) as caught:
            job.forward_backward(text_batch()).result()
        assert caught.value.code == "operation_failed"
        assert "injected failure" in str(caught.value)
        # A failed request has no result tensors to fetch.
        tensors = httpx.get(
            f"{faulty_client.url}/v1/jobs/{job.job_id}/requests/{caught.value.detail['request']['request_id']}/tensors",
            headers={"Authorization": f"Bearer {faulty.token}"},
        )
        assert error_of(tensors, 404)["code"] == "not_found"
        with pytest.raises(RequestFailed) as caught:
            job.forward(text_batch()).result()
        assert caught.value.code == "out_of_memory" and "CUDA out of memory" in str(caught.value)
        # The worker lives on and serves the next request.
        assert job.generate(["ab"], max_tokens=3, temperature=0.0).result().tokens[0]


def test_a_training_loop_that_breaks_fails_its_job_with_training_loop_failed(faulty_client):
    spec = {
        "base_model": "tiny",
        "steps": 3,
        "batch_size": 2,
        "max_seq_len": 16,
        "data": addition_problems()[:8],
    }
    run = faulty_client.train(spec)
    with pytest.raises(RequestFailed) as caught:
        run.wait(timeout_s=120)
    assert caught.value.code == "training_loop_failed" and "injected failure" in str(caught.value)
    job = faulty_client.get_job(run.job_id)
    assert job["status"] == JOB_FAILED and job["failure_code"] == "training_loop_failed", job


def test_damaged_full_weights_fail_the_sync_with_weight_sync_failed(faulty_client):
    with faulty_client.create_training_job("tiny", samplers=1, seed=0) as job:
        with pytest.raises(RequestFailed) as caught:
            job.sync_sampler(weight_format="full").result()
        assert caught.value.code == "weight_sync_failed"
        assert "sampling-0" in str(caught.value)


def test_a_model_whose_weights_do_not_load_fails_the_job_with_worker_start_failed(faulty_client):
    job_id = faulty_client.create_job([{"type": "sampling", "base_model": "broken-gpt2"}])["job_id"]
    job = faulty_client.wait_for_job(job_id, until=(JOB_FAILED, "done", "cancelled"), timeout_s=120)
    assert job["status"] == JOB_FAILED and job["failure_code"] == "worker_start_failed", job


def test_a_tinker_session_without_heartbeats_expires(faulty):
    key = create_token(faulty.data_dir, "tinker-user", "jobs:read", "jobs:write", tinker=True)
    headers = {"X-API-Key": key}
    with httpx.Client(base_url=faulty.url + "/api/v1", headers=headers, timeout=60) as api:
        session_id = api.post("/create_session", json={"tags": [], "sdk_version": "0.38.0"}).json()[
            "session_id"
        ]
        time.sleep(1.6)
        error = error_of(api.post("/session_heartbeat", json={"session_id": session_id}), 410)
        assert error["code"] == "session_expired" and error["detail"]["ended"].startswith("expired")


def test_chunk_groups_that_disagree_or_lack_chunks_are_refused(faulty):
    headers = {"Authorization": f"Bearer {faulty.token}"}
    with httpx.Client(base_url=faulty.url, headers=headers, timeout=60) as http:
        job_id = http.post(
            "/v1/jobs", json={"sub_jobs": [{"type": "sampling", "base_model": "tiny"}]}
        ).json()["job_id"]
        path = f"/api/v2/databases/DB/schemas/SCHEMA/cortex-training/{job_id}/forward-backward"
        tokens = torch.arange(4000).reshape(40, 100) % 250

        def chunks(shift: int, group: str) -> list[bytes]:
            frame = serialize_forward_backward_args((), {"input_ids": tokens + shift, "labels": tokens})
            return sdk_wire.encode_byte_chunks(
                frame, kind="request", operation="fwd-bwd", max_bytes=16 * 1024, chunk_group_id=group
            )

        first, other = chunks(0, "group-a"), chunks(1, "group-a")
        assert http.post(path, content=first[0]).json()["status"] == "received"
        conflict = error_of(http.post(path, content=other[1]), 409)
        assert (
            conflict["code"] == "chunk_group_conflict" and conflict["detail"]["chunk_group_id"] == "group-a"
        )

        gappy = chunks(0, "group-b")
        assert http.post(path, content=gappy[0]).json()["status"] == "received"
        missing = error_of(http.post(path, content=gappy[-1]), 409)
        assert missing["code"] == "chunk_group_missing_chunks" and 1 in missing["detail"]["missing"]


def test_a_step_on_non_finite_gradients_is_refused_and_skipped(client):
    """Loss weights near float32's largest value overflow the gradient; the step says so and changes nothing."""
    batch = text_batch()
    batch["weights"] = batch["weights"] * 3e38
    with client.create_training_job("tiny", seed=0) as job:
        before = job.forward(text_batch()).result()["tensors"]["logprobs"]
        job.forward_backward(batch).result()
        with pytest.raises(RequestFailed) as caught:
            job.step().result()
        assert caught.value.code == "non_finite_gradients" and "skipped" in str(caught.value)
        after = job.forward(text_batch()).result()["tensors"]["logprobs"]
        assert (before == after).all()
