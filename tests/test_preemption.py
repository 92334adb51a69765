"""Preemption (`--preempt-below`): on one CPU slot, a low-priority training run gives its device to a
higher-priority job by pausing at a resumable checkpoint, is queued again, and resumes to its total steps
with no step lost (the curve of an uninterrupted run). Without the option the higher band waits."""

from __future__ import annotations

import pytest

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems

from .backend_process import start_backend
from .notebook_fixtures import wait_until

SPEC = {
    "base_model": "tiny",
    "batch_size": 8,
    "max_seq_len": 16,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 7,
    "data": addition_problems(),
}
STEPS = 80
SAMPLER = [{"type": "sampling", "base_model": "tiny"}]


@pytest.fixture(scope="module")
def preempting(tmp_path_factory):
    backend = start_backend(
        tmp_path_factory.mktemp("preempting"), "--devices", "cpu:1", "--preempt-below", "5"
    )
    with Client(backend.url, backend.token) as client:
        yield client
    backend.stop()


def curve(job: dict) -> list[tuple[int, float]]:
    return [(point["step"], point["loss_per_token"]) for point in job["progress"]["history"]]


def logs_of(client: Client, job_id: str) -> str:
    return "\n".join(line["line"] for line in client.stream_logs(job_id, follow=False))


def test_a_low_priority_run_is_paused_for_a_higher_band_and_resumes_losing_no_step(preempting):
    client = preempting
    low = client.train({**SPEC, "steps": STEPS}, name="low", priority=2)
    wait_until(lambda: (low.progress or {}).get("step", 0) >= 5, 300)
    high = client.create_job(SAMPLER, name="high", priority=9)

    # The sampler gets the only slot while the run waits, paused at a checkpoint.
    wait_until(lambda: client.get_job(high["job_id"])["status"] == "running", 300)
    paused = client.get_job(low.job_id)
    assert paused["status"] == "pending"
    (preemption,) = paused["progress"]["preemptions"]
    assert preemption["by_priority"] == 9
    assert preemption["checkpoint_id"] == f"drained-step-{preemption['step']}"
    assert 5 <= preemption["step"] < STEPS
    checkpoints = {c["checkpoint_id"]: c for c in client.list_checkpoints(low.job_id)}
    assert checkpoints[preemption["checkpoint_id"]]["type"] == "resumable"
    assert checkpoints[preemption["checkpoint_id"]]["step"] == preemption["step"]

    client.cancel_job(high["job_id"])
    finished = low.wait(timeout_s=600)
    assert finished["status"] == "done", finished
    assert finished["started_at"] >= client.get_job(high["job_id"])["started_at"]
    progress = finished["progress"]
    assert progress["step"] == progress["total_steps"] == STEPS
    resumed = progress["resumed"]
    assert resumed["reason"] == "preempted" and resumed["lost_steps"] == 0
    assert (resumed["checkpoint_id"], resumed["step"]) == (preemption["checkpoint_id"], preemption["step"])
    assert [step for step, _ in curve(finished)] == list(range(1, STEPS + 1))
    reference = client.train({**SPEC, "steps": STEPS}, name="reference").wait(timeout_s=600)
    assert [loss for _, loss in curve(finished)] == pytest.approx(
        [loss for _, loss in curve(reference)], rel=1e-5, abs=1e-6
    )
    logs = logs_of(client, low.job_id)
    assert f"preempted by a priority-9 job: paused at step {preemption['step']}" in logs
    assert (
        f"resumes from checkpoint {preemption['checkpoint_id']} (step {preemption['step']}); no step" in logs
    )
    assert "Traceback" not in logs


def test_a_run_at_or_above_the_band_is_not_preempted(preempting):
    client = preempting
    run = client.train({**SPEC, "steps": 40}, name="at-the-band", priority=5)
    wait_until(lambda: (run.progress or {}).get("step", 0) >= 2, 300)
    high = client.create_job(SAMPLER, name="waits", priority=9)
    finished = run.wait(timeout_s=600)
    assert finished["status"] == "done"
    assert finished["progress"]["preemptions"] == [] and finished["progress"]["resumed"] is None
    wait_until(lambda: client.get_job(high["job_id"])["status"] == "running", 300)
    assert client.get_job(high["job_id"])["started_at"] >= finished["finished_at"] - 1e-3
    client.cancel_job(high["job_id"])


def test_without_preempt_below_a_higher_band_waits_for_the_run(tmp_path):
    backend = start_backend(tmp_path / "data", "--devices", "cpu:1")
    try:
        with Client(backend.url, backend.token) as client:
            run = client.train({**SPEC, "steps": 40}, name="low", priority=0)
            wait_until(lambda: (run.progress or {}).get("step", 0) >= 2, 300)
            high = client.create_job(SAMPLER, name="high", priority=9)
            assert client.get_job(high["job_id"])["status"] == "pending"
            finished = run.wait(timeout_s=600)
            assert finished["status"] == "done"
            assert finished["progress"]["preemptions"] == [] and finished["progress"]["resumed"] is None
            assert "preempted" not in logs_of(client, run.job_id)
            wait_until(lambda: client.get_job(high["job_id"])["status"] == "running", 300)
            assert client.get_job(high["job_id"])["started_at"] >= finished["finished_at"] - 1e-3
    finally:
        backend.stop()
