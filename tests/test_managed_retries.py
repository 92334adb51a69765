"""A training run's retry policy: an attempt whose worker is killed is retried from the run's newest resumable
checkpoint and trains to its total steps, each attempt recorded in its progress record, log and events; a
failure the policy does not name ends the run; `max` bounds the attempts. Real backend, real workers."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from cortex_nb import Client, RequestFailed
from cortex_nb.demo_data import addition_problems

from .backend_process import start_backend
from .notebook_fixtures import wait_until

SPEC = {
    "base_model": "tiny",
    "batch_size": 8,
    "max_seq_len": 16,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 5,
}
STEPS = 100
SAVE_EVERY = 10


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    process = start_backend(tmp_path_factory.mktemp("managed-retries"), "--devices", "cpu:1")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(backend):
    with Client(backend.url, backend.token) as client:
        yield client


def worker_pid(client: Client, job_id: str) -> int | None:
    job = client.get_job(job_id)
    if job["status"] != "running":
        return None
    return (job["sub_jobs"][0].get("info") or {}).get("pid")


def kill_worker_after_a_checkpoint(client: Client, job, at_least: int) -> int:
    """SIGKILL the run's worker once a periodic checkpoint at step >= `at_least` is recorded; its pid."""
    wait_until(lambda: ((job.progress or {}).get("last_checkpoint_step") or 0) >= at_least, 300)
    pid = worker_pid(client, job.job_id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_failed(client: Client, job) -> dict:
    with pytest.raises(RequestFailed) as failed:
        job.wait(timeout_s=300)
    assert failed.value.code == "worker_crashed"
    return client.get_job(job.job_id)


def logs_of(client: Client, job_id: str) -> str:
    return "\n".join(line["line"] for line in client.stream_logs(job_id, follow=False))


def curve(job: dict) -> list[tuple[int, float]]:
    return [(point["step"], point["loss_per_token"]) for point in job["progress"]["history"]]


def run_spec(retry: dict) -> dict:
    return {
        **SPEC,
        "data": addition_problems(),
        "steps": STEPS,
        "save": {"every": SAVE_EVERY, "type": "resumable"},
        "retry": retry,
    }


def test_a_killed_worker_is_retried_from_its_checkpoint_and_the_run_trains_all_its_steps(client):
    job = client.train(
        run_spec({"max": 2, "on": ["worker_crashed"], "backoff_s": 0.5}), name="retried", priority=3
    )
    kill_worker_after_a_checkpoint(client, job, SAVE_EVERY)
    finished = job.wait(timeout_s=600)

    assert finished["status"] == "done", finished
    assert finished["priority"] == 3
    progress = finished["progress"]
    assert progress["step"] == progress["total_steps"] == STEPS
    (attempt,) = progress["attempts"]
    assert (attempt["attempt"], attempt["status"], attempt["failure_code"], attempt["retry_reason"]) == (
        1,
        "failed",
        "worker_crashed",
        "worker_crashed",
    )
    assert attempt["started_at"] < attempt["finished_at"] <= finished["finished_at"]
    resumed = progress["resumed"]
    assert resumed["reason"] == "retry" and resumed["restarts"] == 1
    assert resumed["step"] % SAVE_EVERY == 0 and SAVE_EVERY <= resumed["step"] <= attempt["step"]
    assert resumed["lost_steps"] == attempt["step"] - resumed["step"]
    # The curve has every step once, and is the one an uninterrupted run of the same spec draws.
    assert [step for step, _ in curve(finished)] == list(range(1, STEPS + 1))
    uninterrupted = {key: value for key, value in run_spec({}).items() if key != "retry"}
    reference = client.train(uninterrupted, name="reference")
    expected = reference.wait(timeout_s=600)
    assert [loss for _, loss in curve(finished)] == pytest.approx(
        [loss for _, loss in curve(expected)], rel=1e-5, abs=1e-6
    )

    logs = logs_of(client, job.job_id)
    assert "attempt 1 failed (worker_crashed: worker_crashed)" in logs
    assert "retrying in 0.5 s (attempt 2 of at most 3)" in logs
    assert f"attempt 2: this run resumes from checkpoint {resumed['checkpoint_id']}" in logs
    # The event feed shows the run going back to pending with the attempt's failure code, then done.
    events = [
        (event["status"], event.get("failure_code"))
        for event in client.list_events(limit=1000)["events"]
        if event["kind"] == "job" and event["job_id"] == job.job_id
    ]
    retried = events.index(("pending", "worker_crashed"))
    assert events[retried + 1 :] == [("starting", None), ("running", None), ("done", None)]


def test_a_failure_the_policy_does_not_name_ends_the_run(client):
    job = client.train(run_spec({"max": 2, "on": ["oom"], "backoff_s": 0}), name="not-covered")
    kill_worker_after_a_checkpoint(client, job, SAVE_EVERY)
    finished = wait_failed(client, job)
    assert finished["status"] == "failed" and finished["failure_code"] == "worker_crashed"
    attempts = finished["progress"]["attempts"]
    assert [(a["attempt"], a["retry_reason"]) for a in attempts] == [(1, "worker_crashed")]
    assert "retrying in" not in logs_of(client, job.job_id)


def test_max_bounds_the_attempts(client):
    job = client.train(run_spec({"max": 1, "on": ["worker_crashed"], "backoff_s": 0}), name="bounded")
    first = kill_worker_after_a_checkpoint(client, job, SAVE_EVERY)
    # Attempt 2 runs on a new worker (its pending state's failure code cleared); kill that one too.
    wait_until(lambda: worker_pid(client, job.job_id) not in (None, first), 300)
    assert client.get_job(job.job_id)["failure_code"] is None
    kill_worker_after_a_checkpoint(client, job, 2 * SAVE_EVERY)
    finished = wait_failed(client, job)
    assert finished["status"] == "failed" and finished["failure_code"] == "worker_crashed"
    attempts = finished["progress"]["attempts"]
    assert [(a["attempt"], a["retry_reason"]) for a in attempts] == [
        (1, "worker_crashed"),
        (2, "worker_crashed"),
    ]
    logs = logs_of(client, job.job_id)
    assert "attempt 2 failed (worker_crashed: worker_crashed); no retry is left" in logs
    assert logs.count("retrying in") == 1


def test_an_out_of_memory_loop_is_retried_up_to_max_then_fails_with_its_code(tmp_path):
    """`oom`: the loop fails `out_of_memory` with its worker alive (here, every attempt: an injected fault)."""
    backend = start_backend(tmp_path / "data", "--devices", "cpu:1", "--fault-injection", "oom_training_loop")
    try:
        with Client(backend.url, backend.token) as client:
            job = client.train(run_spec({"max": 1, "on": ["oom"], "backoff_s": 0}), name="oom")
            with pytest.raises(RequestFailed) as failed:
                job.wait(timeout_s=300)
            assert failed.value.code == "out_of_memory"
            finished = client.get_job(job.job_id)
            attempts = finished["progress"]["attempts"]
            assert [(a["attempt"], a["failure_code"], a["retry_reason"]) for a in attempts] == [
                (1, "out_of_memory", "oom"),
                (2, "out_of_memory", "oom"),
            ]
            assert all(a["step"] == 0 for a in attempts)
            assert [a["started_at"] for a in attempts] == sorted({a["started_at"] for a in attempts})
            loops = [r for r in client.list_requests(job.job_id) if r["op"] == "train_loop"]
            assert len(loops) == 2 and all(r["status"] == "failed" for r in loops)
            logs = logs_of(client, job.job_id)
            assert "attempt 2: this run resumes from step 0 (no resumable checkpoint)" in logs
            assert "attempt 2 failed (oom: out_of_memory); no retry is left" in logs
    finally:
        backend.stop()


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"max": 2, "on": ["timeout"]}, "training_loop.retry.on"),
        ({"on": ["worker_crashed"]}, "training_loop.retry.max"),
        ({"max": 11}, "training_loop.retry.max"),
        ({"max": 1, "backoff_s": -1}, "training_loop.retry.backoff_s"),
    ],
)
def test_a_bad_retry_policy_is_refused_naming_its_field(backend, retry, field):
    body = {
        "sub_jobs": [{"type": "training", "base_model": "tiny"}],
        "training_loop": {"data": {"dataset_id": "0" * 64}, "steps": 5, "retry": retry},
    }
    answer = httpx.post(
        f"{backend.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {backend.token}"}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_field"
    assert error["detail"]["field"] == field
