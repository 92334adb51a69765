"""CPU workers are forks of one process that imported their libraries once (worker_forkserver.py): they
train exactly as workers started as processes do, the fork server keeps no secret of the backend's, and its
loss or the backend's leaves no worker behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from cortex_nb import Client

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .training_data import random_batches
from .unprivileged import UNPRIVILEGED_UID, make_user_home, unavailable_reason

TINY_VOCAB = 259


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def train(client: Client, steps: int = 3) -> list[float]:
    job = client.create_training_job("tiny", seed=7, lora={"r": 4, "alpha": 8})
    try:
        losses = []
        for batch in random_batches(steps, TINY_VOCAB, rows=2, length=16, seed=3):
            losses.append(job.forward_backward(batch).result()["loss"])
            job.step().result()
        return losses
    finally:
        job.cancel()


def fork_server_pid(client: Client) -> int | None:
    return (client.get_capacity()["executor"].get("fork_server") or {}).get("pid")


def test_a_forked_worker_trains_bitwise_as_a_started_process_and_keeps_no_backend_secret(tmp_path: Path):
    common = ("--devices", "cpu:1", "--worker-threads", "1")
    secret = {"CORTEX_PROBE_SECRET": "do-not-inherit"}
    forked = start_backend(tmp_path / "forked", *common, env=secret)
    started = start_backend(tmp_path / "started", *common, "--worker-start", "exec")
    try:
        fork_client, start_client = Client(forked.url, forked.token), Client(started.url, started.token)
        job = fork_client.create_training_job("tiny")
        try:
            pid = job.info["sub_jobs"][0]["info"]["pid"]
            server = fork_server_pid(fork_client)
            assert server is not None and psutil.Process(pid).ppid() == server
            assert psutil.Process(server).ppid() == forked.pid
            assert Path(f"/proc/{pid}/comm").read_text().strip() == "cortex-worker"
            # The fork server started with a worker's environment: the backend's own configuration scrubbed.
            environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
            assert not [entry for entry in environ if entry.startswith(b"CORTEX_")]
        finally:
            job.cancel()
        assert fork_server_pid(start_client) is None
        forked_losses, started_losses = train(fork_client), train(start_client)
        assert forked_losses == started_losses, (forked_losses, started_losses)
        assert len(set(forked_losses)) == len(forked_losses)  # it trained: each step's loss differs
    finally:
        forked.stop()
        started.stop()


def test_a_killed_fork_server_fails_its_workers_jobs_and_later_workers_start_as_processes(tmp_path: Path):
    backend = start_backend(tmp_path / "killed", "--devices", "cpu:2", "--worker-threads", "1")
    client = Client(backend.url, backend.token)
    try:
        victim = client.create_training_job("tiny")
        server = fork_server_pid(client)
        assert server is not None
        os.kill(server, signal.SIGKILL)
        failed = client.wait_for_job(victim.job_id, ("failed",), timeout_s=60)
        assert failed["failure_code"] == "worker_crashed", failed
        assert fork_server_pid(client) is None
        # The service carries on: the next job's worker is a process of the backend's own, and it trains.
        after = client.create_training_job("tiny")
        try:
            assert psutil.Process(after.info["sub_jobs"][0]["info"]["pid"]).ppid() == backend.pid
            batch = random_batches(1, TINY_VOCAB)[0]
            assert np.isfinite(after.forward_backward(batch).result()["loss"])
            assert after.step().result()["step"] == 1
        finally:
            after.cancel()
        assert "workers start as processes of their own" in backend.log()
    finally:
        backend.stop()


def test_a_killed_backend_takes_the_fork_server_and_its_workers_with_it(tmp_path: Path):
    backend = start_backend(tmp_path / "power-cut", "--devices", "cpu:1", "--worker-threads", "1")
    client = Client(backend.url, backend.token)
    job = client.create_training_job("tiny")
    worker = job.info["sub_jobs"][0]["info"]["pid"]
    server = fork_server_pid(client)
    assert server is not None
    spares = [child.pid for child in psutil.Process(server).children() if child.pid != worker]
    backend.kill()
    started = time.monotonic()
    wait_until(lambda: all(gone(pid) for pid in (server, worker, *spares)), 30)
    assert time.monotonic() - started < 30


@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
def test_an_ordinary_users_backend_forks_its_workers_as_that_user(tmp_path: Path):
    user = make_user_home()
    backend = user.start_backend("--devices", "cpu:1", "--worker-threads", "1")
    try:
        client = Client(backend.url, backend.token)
        job = client.create_training_job("tiny")
        try:
            worker = psutil.Process(job.info["sub_jobs"][0]["info"]["pid"])
            assert worker.ppid() == fork_server_pid(client)
            assert worker.uids().real == worker.uids().effective == UNPRIVILEGED_UID
            batch = random_batches(1, TINY_VOCAB)[0]
            assert np.isfinite(job.forward_backward(batch).result()["loss"])
            assert job.step().result()["step"] == 1
        finally:
            job.cancel()
    finally:
        backend.stop()
        user.remove()
