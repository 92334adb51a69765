"""The event feed: ordered job and request state changes behind a cursor, never drained by reading,
scoped to the caller's own jobs, and long-polled."""

from __future__ import annotations

import threading

import httpx

from cortex_nb import Client
from cortex_nb.protocol.states import JOB_CANCELLED, JOB_DONE

from .tokens import create_token

BATCH = {"input_ids": [[1, 2]], "target_tokens": [[2, 3]], "weights": [[1.0, 1.0]]}


def all_events(client: Client, after: int = 0) -> list[dict]:
    events = []
    while True:
        page = client.list_events(after=after, limit=7)
        events.extend(page["events"])
        if not page["events"]:
            return events
        after = page["cursor"]


def test_job_and_request_changes_form_one_ordered_feed(client):
    start = client.list_events(after=0, limit=1000)
    while start["events"]:
        start = client.list_events(after=start["cursor"], limit=1000)
    job = client.create_training_job("tiny", lora={"r": 1})
    request_id = client.forward_backward(job.job_id, BATCH)
    client.poll_request(job.job_id, request_id)
    job.complete()
    client.wait_for_job(job.job_id, until=(JOB_DONE,))

    events = [event for event in all_events(client, start["cursor"]) if event["job_id"] == job.job_id]
    seqs = [event["seq"] for event in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert [event["status"] for event in events if event["kind"] == "job"] == [
        "pending",
        "starting",
        "running",
        "done",
    ]
    request_events = [event for event in events if event["kind"] == "request"]
    assert [event["status"] for event in request_events] == ["queued", "running", "succeeded"]
    assert {event["request_id"] for event in request_events} == {request_id}
    assert request_events[0]["op"] == "forward_backward" and request_events[0]["sub_job_id"] == "training-0"
    assert all("failure_code" not in event for event in events)
    ats = [event["at"] for event in events]
    assert ats == sorted(ats)


def test_reading_never_drains_the_feed(client):
    first = client.list_events(after=0, limit=50)
    again = client.list_events(after=0, limit=50)
    assert first == again and first["events"]
    # A poll whose answer was lost is simply asked again with the same cursor.
    assert client.list_events(after=first["events"][0]["seq"], limit=10)["events"] == first["events"][1:11]


def test_a_failed_job_carries_its_failure_code(client):
    job = client.create_training_job("tiny", lora={"r": 1}, wait=False)
    client.cancel_job(job.job_id)
    events = [
        event for event in all_events(client) if event["job_id"] == job.job_id and event["kind"] == "job"
    ]
    assert events[-1]["status"] == JOB_CANCELLED and events[-1]["failure_code"] == "cancelled"


def test_a_user_sees_only_events_of_their_own_jobs(backend, client):
    with (
        Client(backend.url, create_token(backend.data_dir, "walter", "jobs:read", "jobs:write")) as walter,
        Client(backend.url, create_token(backend.data_dir, "jesse", "jobs:read", "jobs:write")) as jesse,
    ):
        mine = walter.create_training_job("tiny", lora={"r": 1}, wait=False)
        theirs = jesse.create_training_job("tiny", lora={"r": 1}, wait=False)
        walter.cancel_job(mine.job_id)
        jesse.cancel_job(theirs.job_id)
        walter_jobs = {event["job_id"] for event in all_events(walter)}
        assert walter_jobs == {mine.job_id}
        assert {event["job_id"] for event in all_events(jesse)} == {theirs.job_id}
        admin_jobs = {event["job_id"] for event in all_events(client)}
        assert {mine.job_id, theirs.job_id} <= admin_jobs
        # Walter's cursor moves past Jesse's events, so his next poll does not scan them again.
        last = client.list_events(after=0, limit=1000)
        while last["events"]:
            last = client.list_events(after=last["cursor"], limit=1000)
        quiet = walter.list_events(after=0, limit=1000)
        quiet = walter.list_events(after=quiet["cursor"], limit=1000)
        assert quiet["events"] == [] and quiet["cursor"] == last["cursor"]


def test_long_poll_wakes_on_the_next_event(backend, client):
    cursor = client.list_events(after=0, limit=1000)
    while cursor["events"]:
        cursor = client.list_events(after=cursor["cursor"], limit=1000)
    answer: dict = {}
    waiter = threading.Thread(
        target=lambda: answer.update(client.list_events(after=cursor["cursor"], wait_s=30))
    )
    waiter.start()
    job = client.create_training_job("tiny", lora={"r": 1}, wait=False)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert (
        answer["events"]
        and answer["events"][0]["job_id"] == job.job_id
        and answer["events"][0]["status"] == "pending"
    )
    client.cancel_job(job.job_id)


def test_events_need_a_token_and_check_their_arguments(backend):
    assert httpx.get(f"{backend.url}/v1/events").status_code == 401
    response = httpx.get(
        f"{backend.url}/v1/events",
        params={"after": "x"},
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field"
