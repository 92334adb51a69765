"""A run's device-seconds budget: spent, the run stops after the step in hand and saves `final`; the
widget shows the device-seconds; `%cortex usage` totals them per user and per job."""

from __future__ import annotations

import pytest

from cortex_nb import Client
from cortex_nb.train_spec import SpecError, parse_budget, parse_train_spec
from cortex_nb.widgets import job_view

from .notebook_fixtures import run_cell, train_spec

BUDGET_S = 20.0


@pytest.fixture(scope="module")
def budgeted_run(cortex_shell, backend):
    """A run planned far past its budget, started with `%%cortex train --budget 20s`, waited for. A job
    started first takes the cost of a cold worker (the budget counts device time from the job's start)."""
    with Client(backend.url, backend.token) as client:
        client.create_sampler("tiny").cancel()
    ran = run_cell(cortex_shell, "%%cortex train --wait --budget 20s --name budgeted\n" + train_spec(100000))
    assert ran.success, ran.stderr
    with Client(backend.url, backend.token) as client:
        yield ran.result.job_id, client.get_job(ran.result.job_id), client.list_checkpoints(ran.result.job_id)


def test_a_spent_budget_stops_within_one_step_with_a_checkpoint(budgeted_run):
    _, job, checkpoints = budgeted_run
    progress = job["progress"]
    assert job["status"] == "done" and progress["phase"] == "stopped"
    assert job["training_loop"]["budget_device_s"] == BUDGET_S == progress["budget_device_s"]
    stop = progress["budget_stop"]
    # Found spent at the first step whose recorded device-seconds reached the budget (the step before was
    # under it; a worker that started slowly can spend it all before step 1) ...
    assert BUDGET_S <= stop["device_seconds"]
    assert stop["before"] < BUDGET_S if stop["step"] > 1 else stop["before"] is None
    # ... and stopped within one step of it, far short of the planned steps.
    assert stop["step"] <= progress["step"] <= stop["step"] + 1 < progress["total_steps"]
    final = [row for row in checkpoints if row["checkpoint_id"] == "final"]
    assert len(final) == 1 and final[0]["step"] == progress["step"]
    # The job's own count goes on to its end (the final save, the worker stopping), from the same clock.
    assert job["device_seconds"] >= stop["device_seconds"]


def test_the_widget_shows_device_seconds_of_the_budget(budgeted_run):
    from cortex_nb.job_state import JobState

    job_id, job, _ = budgeted_run
    state = JobState(job_id, "budgeted", "tiny")
    state.set_job(job)
    text = " ".join(job_view.stats_parts(state.snapshot(), now=job["finished_at"]))
    assert f"{job['device_seconds']:,.0f} device-s of 20 budget" in text


def test_usage_totals_per_user_and_per_job(cortex_shell, budgeted_run):
    job_id, job, _ = budgeted_run
    ran = run_cell(cortex_shell, "%cortex usage --days 1")
    assert ran.success, ran.stderr
    frame = ran.result
    per_job = frame[frame["per"] == "job"].set_index("name")["device_seconds"]
    assert per_job[job_id] == pytest.approx(job["device_seconds"], abs=0.01)
    per_user = frame[frame["per"] == "user"]
    assert len(per_user) >= 1 and per_user["device_seconds"].sum() >= per_job.sum() - 0.01


def test_a_budget_must_be_a_positive_duration(cortex_shell):
    for budget, says in (("0", "a budget must be more than 0"), ("soon", "is not a duration")):
        ran = run_cell(cortex_shell, f"%%cortex train --budget {budget}\n" + train_spec(5))
        assert not ran.success and says in ran.stderr, ran.stderr
    assert parse_budget("600", "budget") == 600.0 and parse_budget("10m", "budget") == 600.0
    with pytest.raises(SpecError, match="budget: a budget must be more than 0"):
        parse_train_spec(train_spec(5, budget="0s"))
    assert parse_train_spec(train_spec(5, budget="1h")).budget_device_s == 3600.0
