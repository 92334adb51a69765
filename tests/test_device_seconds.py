"""Device-seconds of a job that went back to the queue (a preemption, a parking, a retry, a restart): each
span it held its devices counts, the waits between them do not."""

from __future__ import annotations

from cortex_backend.stats import job_device_seconds, span_closed


def test_spans_add_up_and_waits_between_them_do_not():
    job = {"started_at": 100.0, "finished_at": None, "held_seconds": 0.0, "sub_jobs": [{}, {}]}
    assert job_device_seconds(job, now=130.0) == 60.0  # two sub-jobs, 30 s each
    job |= span_closed(job, end=130.0)
    assert job["started_at"] is None and job["held_seconds"] == 30.0
    assert job_device_seconds(job, now=500.0) == 60.0  # queued: nothing more
    job["started_at"] = 500.0  # started again
    assert job_device_seconds(job, now=510.0) == 80.0
    job["finished_at"] = 520.0
    assert job_device_seconds(job, now=900.0) == 100.0


def test_a_job_that_never_started_closes_no_span():
    assert span_closed({"started_at": None, "held_seconds": 0.0}) == {}
