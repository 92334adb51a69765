"""Queue priorities: a higher band starts first, a token may ask only as high as it is allowed, and
waiting raises a low band (aging) so it is never starved (the rule in cortex_nb/protocol/priority.py)."""

from __future__ import annotations

import time

import pytest
from cortex_backend.devices import Device
from cortex_backend.scheduler import Scheduler

from cortex_nb import Client, errors
from cortex_nb.protocol.priority import MAX_PRIORITY, aging_bound_s, effective_priority
from cortex_nb.run_spec import validate_spec

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .tokens import create_token

SAMPLER = [{"type": "sampling", "base_model": "tiny"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def one_slot_scheduler(aging_s: float) -> tuple[Scheduler, Clock]:
    clock = Clock()
    return Scheduler([Device("cpu", "cpu", None, "CPU", None, 1)], aging_s=aging_s, clock=clock), clock


def test_the_queue_orders_by_band_then_submission_time():
    scheduler, clock = one_slot_scheduler(aging_s=0)
    scheduler.enqueue("holder", 1)
    assert [holder for holder, _ in scheduler.admit()] == ["holder"]
    for index, priority in enumerate((5, 5, 5, 9, 0, 9)):
        clock.now += 1
        scheduler.enqueue(f"job-{index}", 1, priority=priority)
    assert scheduler.pending_holders() == ["job-3", "job-5", "job-0", "job-1", "job-2", "job-4"]
    scheduler.release("holder")
    assert [holder for holder, _ in scheduler.admit()] == ["job-3"]


def test_aging_puts_a_low_band_ahead_of_later_work_within_the_bound():
    aging_s = 60.0
    scheduler, clock = one_slot_scheduler(aging_s)
    scheduler.enqueue("holder", 1)
    scheduler.admit()
    scheduler.enqueue("low", 1, priority=0)
    bound = aging_bound_s(0, aging_s)
    assert bound == 9 * aging_s
    # A stream of priority-9 work keeps arriving; before the bound each newcomer is ahead of `low` ...
    clock.now += bound - 1
    scheduler.enqueue("early-9", 1, priority=9)
    assert scheduler.pending_holders() == ["early-9", "low"]
    assert scheduler.priority_of("low")[1] == 8
    # ... and from the bound on `low` is in the top band and older than anything submitted since.
    clock.now += 1
    scheduler.enqueue("late-9", 1, priority=9)
    assert scheduler.priority_of("low") == (0, MAX_PRIORITY, 1000.0)
    assert scheduler.pending_holders() == ["low", "early-9", "late-9"]
    scheduler.release("holder")
    assert [holder for holder, _ in scheduler.admit()] == ["low"]


def test_effective_priority_never_passes_the_top_band_and_aging_can_be_off():
    assert effective_priority(3, 10_000, 1.0) == MAX_PRIORITY
    assert effective_priority(3, 10_000, 0.0) == 3
    assert effective_priority(3, 59.9, 30.0) == 4


def test_a_run_spec_takes_a_priority_band_and_labels():
    spec = validate_spec(
        {"version": 1, "name": "r", "command": "true", "priority": 7, "labels": {"team": "nlp"}}
    )
    assert spec["priority"] == 7 and spec["labels"] == {"team": "nlp"}
    assert "priority" not in validate_spec({"version": 1, "name": "r", "command": "true"})
    with pytest.raises(errors.BadRequestError) as info:
        validate_spec({"version": 1, "name": "r", "command": "true", "priority": 10})
    assert info.value.detail["field"] == "priority"


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("priority-backend"),
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--worker-threads",
        "1",
        "--token-max-priority",
        "6",
    )
    yield process
    process.stop()


def test_a_priority_9_job_submitted_after_three_priority_5_jobs_starts_next(one_slot):
    with Client(one_slot.url, one_slot.token) as client:
        holder = client.create_job(SAMPLER, name="holder", idle_timeout_s=0)
        assert holder["status"] != "pending" and holder["priority"] == 5
        normal = [client.create_job(SAMPLER, name=f"normal-{i}") for i in range(3)]
        urgent = client.create_job(SAMPLER, name="urgent", priority=9)
        assert urgent["queue"]["position"] == 1
        assert urgent["queue"]["priority"] == 9 and urgent["queue"]["effective_priority"] == 9
        assert urgent["queue"]["submitted_at"] == urgent["created_at"]
        assert [client.get_job(job["job_id"])["queue"]["position"] for job in normal] == [2, 3, 4]
        assert "3 ahead in the queue" in client.get_job(normal[2]["job_id"])["queue"]["reason"]
        pending = client.get_capacity()["pending_jobs"]
        assert [row["job_id"] for row in pending][:2] == [urgent["job_id"], normal[0]["job_id"]]
        client.cancel_job(holder["job_id"])
        # The slot frees once the holder's worker has exited; then the urgent job is admitted first.
        deadline = time.monotonic() + 60
        while client.get_job(urgent["job_id"])["status"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get_job(urgent["job_id"])["status"] in ("starting", "running")
        assert all(client.get_job(job["job_id"])["status"] == "pending" for job in normal)
        for job in (*normal, urgent):
            client.cancel_job(job["job_id"])


def test_a_token_asks_only_as_high_as_it_may(one_slot):
    capped = create_token(one_slot.data_dir, "dana", "jobs:read", "jobs:write")
    raised = create_token(one_slot.data_dir, "erin", "jobs:read", "jobs:write", max_priority=8)
    with Client(one_slot.url, capped) as dana, Client(one_slot.url, raised) as erin:
        with pytest.raises(errors.PermissionError) as info:
            dana.create_job(SAMPLER, priority=7)
        assert info.value.code == "priority_not_allowed"
        assert info.value.detail == {"field": "priority", "max_priority": 6}
        low = dana.create_job(SAMPLER, priority=0)
        assert low["priority"] == 0
        allowed = erin.create_job(SAMPLER, priority=8)
        assert allowed["priority"] == 8
        with pytest.raises(errors.BadRequestError) as bad:
            erin.create_job(SAMPLER, priority=10)
        assert bad.value.detail["field"] == "priority"
        for job in (low, allowed):
            dana.cancel_job(job["job_id"]) if job["owner"] == "dana" else erin.cancel_job(job["job_id"])
    with Client(one_slot.url, one_slot.token) as admin:
        top = admin.create_job(SAMPLER, priority=9)
        assert top["priority"] == 9
        admin.cancel_job(top["job_id"])


def test_aging_starts_a_priority_0_job_before_later_priority_9_work(tmp_path):
    aging_s = 0.3
    backend = start_backend(
        tmp_path / "aging", "--devices", "cpu:1", "--warm-workers", "0", "--queue-aging-s", str(aging_s)
    )
    try:
        with Client(backend.url, backend.token) as client:
            holder = client.create_job(SAMPLER, name="holder", idle_timeout_s=0)
            low = client.create_job(SAMPLER, name="low", priority=0)
            # Within the documented bound (9 bands x aging_s) it is in the top band ...
            wait_until(
                lambda: client.get_job(low["job_id"])["queue"]["effective_priority"] == MAX_PRIORITY,
                aging_bound_s(0, aging_s) + 30,
            )
            # ... so priority-9 work submitted since waits behind it, and it starts next.
            later = client.create_job(SAMPLER, name="later", priority=9)
            assert later["queue"]["position"] == 2
            client.cancel_job(holder["job_id"])
            # The slot frees once the holder's worker has exited.
            wait_until(lambda: client.get_job(low["job_id"])["status"] != "pending", 60)
            assert client.get_job(low["job_id"])["status"] in ("starting", "running")
            assert client.get_job(later["job_id"])["status"] == "pending"
            client.cancel_job(low["job_id"])
            client.cancel_job(later["job_id"])
    finally:
        backend.stop()
