"""A worker crash fails only its own job; a backend restart keeps every job, failing the in-flight ones."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from cortex_nb import Client, ConflictError, RequestFailed

from .backend_process import start_backend
from .reference import random_batch


def test_killed_worker_fails_its_job_with_worker_crashed(client: Client):
    victim = client.create_training_job("tiny")
    bystander = client.create_training_job("tiny")
    try:
        batch = random_batch(np.random.default_rng(1), 259, 1, 8)
        pid = victim.info["sub_jobs"][0]["info"]["pid"]
        assert pid != bystander.info["sub_jobs"][0]["info"]["pid"]
        os.kill(pid, signal.SIGKILL)
        job = client.wait_for_job(victim.job_id, ("failed",), timeout_s=60)
        assert job["failure_code"] == "worker_crashed"
        assert job["sub_jobs"][0]["failure_code"] == "worker_crashed"
        assert "signal 9" in job["failure_message"]
        with pytest.raises(ConflictError) as refused:
            victim.forward_backward(batch)
        assert refused.value.code == "job_finished" and "worker_crashed" in refused.value.message
        # The other job and the service carry on.
        assert bystander.forward_backward(batch).result()["loss"] > 0
        assert bystander.step().result()["step"] == 1
    finally:
        bystander.cancel()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_restart_keeps_jobs_and_fails_the_ones_in_flight(tmp_path):
    first = start_backend(tmp_path, "--devices", "cpu:4")
    try:
        with Client(first.url, first.token) as client:
            finished = client.create_training_job("tiny")
            finished.complete()
            running = client.create_training_job("tiny")
            in_flight = running.generate(["x"] * 4, max_tokens=2000, temperature=1.0, ignore_eos=True)
            assert running.status == "running"
            worker_pid = running.info["sub_jobs"][0]["info"]["pid"]
    finally:
        os.kill(first.pid, signal.SIGKILL)  # no graceful shutdown: as after a crash or power cut
        first.process.wait()
    # Its workers die with it instead of computing for no one.
    deadline = time.monotonic() + 30
    while _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(worker_pid)
    second = start_backend(tmp_path, "--devices", "cpu:4")
    try:
        assert second.token == first.token  # the admin token survives a restart
        with Client(second.url, second.token) as client:
            jobs = {job["job_id"]: job for job in client.list_jobs()}
            assert set(jobs) == {finished.job_id, running.job_id}
            assert jobs[finished.job_id]["status"] == "done"
            assert jobs[running.job_id]["status"] == "failed"
            assert jobs[running.job_id]["failure_code"] == "backend_restarted"
            with pytest.raises(RequestFailed) as info:
                client.poll_request(running.job_id, in_flight.request_id, timeout_s=10)
            assert info.value.code == "backend_restarted"
            # And the restarted backend works.
            with client.create_training_job("tiny") as job:
                assert (
                    job.forward_backward(random_batch(np.random.default_rng(0), 259, 1, 8)).result()["loss"]
                    > 0
                )
    finally:
        second.stop()
