"""Jobs driven by their client survive the backend too: SIGTERM saves each one's state after its queued
requests (`drained`), and the next start brings it back holding that checkpoint, loaded before anything
the client sends; after a kill -9 it comes back from its newest resumable save, the lost steps stated.
Real backend processes on one data dir and port; the weights are checked against the same job never
restarted."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from cortex_nb import Client, NotFoundError

from .notebook_fixtures import wait_until
from .test_storage_faults import fill
from .test_storage_faults import small_disk as small_disk_fixture
from .test_surviving_restarts import all_logs, backend_on, free_port
from .tokens import create_token
from .training_data import random_batches, train

TINY_VOCAB = 259
small_disk = small_disk_fixture  # a 96 MiB tmpfs (test_storage_faults.py)
CONFIG = {"lora": {"r": 8, "alpha": 16}, "optimizer": {"lr": 0.01}, "seed": 7}


def logprobs(job, probe) -> np.ndarray:
    return job.forward(probe).result()["tensors"]["logprobs"]


def test_sigterm_saves_a_client_driven_job_and_it_comes_back_holding_it(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    batches = random_batches(3, TINY_VOCAB, seed=21)
    probe = random_batches(1, TINY_VOCAB, seed=99)[0]
    first, second = backend_on(data_dir, port), None
    client = Client(first.url, first.token, reconnect_s=300)
    try:
        # The reference: the same job trained through three steps, with no restart.
        reference = client.create_training_job("tiny", **CONFIG)
        train(reference, batches)
        after_three = logprobs(reference, probe)
        reference.cancel()

        job = client.create_training_job("tiny", **CONFIG)
        train(job, batches[:2])
        after_two = logprobs(job, probe)
        first.process.send_signal(signal.SIGTERM)
        first.process.wait(120)
        assert first.process.returncode == 0
        assert "client-driven job(s) save a checkpoint to come back from" in first.log()

        second = backend_on(data_dir, port)
        # Sent at once: it waits behind the load, so it sees the weights of before the stop, bitwise.
        assert np.array_equal(logprobs(job, probe), after_two)
        back = client.get_job(job.job_id)
        assert back["status"] == "running"
        resumed = back["progress"]["resumed"]
        assert resumed["checkpoint_id"] == "drained" and resumed["step"] == 2 and resumed["lost_steps"] == 0
        [drained] = [c for c in client.list_checkpoints(job.job_id) if c["checkpoint_id"] == "drained"]
        assert drained["type"] == "resumable" and drained["step"] == 2
        # The optimizer's moments came back too: the third step lands where the unrestarted job's did.
        train(job, batches[2:])
        np.testing.assert_allclose(logprobs(job, probe), after_three, rtol=0, atol=1e-6)
        logs = all_logs(client, job.job_id)
        assert (
            "the backend restarted: this job holds checkpoint drained (step 2) loaded; no step was lost"
            in logs
        )
        job.cancel()
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()


def test_after_a_kill_9_a_client_driven_job_comes_back_from_its_newest_resumable_save(tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    batches = random_batches(3, TINY_VOCAB, seed=22)
    probe = random_batches(1, TINY_VOCAB, seed=98)[0]
    first, second = backend_on(data_dir, port), None
    client = Client(first.url, first.token, reconnect_s=300)
    try:
        job = client.create_training_job("tiny", **CONFIG)
        never_saved = client.create_training_job("tiny", **CONFIG)
        train(job, batches[:2])
        job.save("mine").result()
        at_save = logprobs(job, probe)
        train(job, batches[2:])  # a step the crash loses
        assert not np.array_equal(logprobs(job, probe), at_save)
        first.kill()

        second = backend_on(data_dir, port)
        assert np.array_equal(logprobs(job, probe), at_save)
        resumed = client.get_job(job.job_id)["progress"]["resumed"]
        assert resumed["checkpoint_id"] == "mine" and resumed["step"] == 2 and resumed["lost_steps"] == 1
        wait_until(lambda: "1 step(s) trained after it were lost" in all_logs(client, job.job_id), 30)
        # Back, it is still its owner's alone: another owner's token neither sees nor drives it.
        other = Client(second.url, create_token(second.data_dir, "another-owner", "jobs:read", "jobs:write"))
        with pytest.raises(NotFoundError):
            other.get_job(job.job_id)
        with pytest.raises(NotFoundError):
            other.api.forward(job.job_id, probe)
        other.close()
        # Without a resumable checkpoint there is nothing to come back with: it failed, saying so.
        failed = client.get_job(never_saved.job_id)
        assert failed["status"] == "failed" and failed["failure_code"] == "backend_restarted"
        job.cancel()
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()


def test_a_full_disk_at_the_stop_leaves_the_job_its_older_save(small_disk):
    # The drain's own save is refused by the store: the stop still ends cleanly, saying so, and the job
    # comes back from the save it had.
    port = free_port()
    probe = random_batches(1, TINY_VOCAB, seed=97)[0]
    first, second = backend_on(small_disk / "data", port), None
    client = Client(first.url, first.token, reconnect_s=300)
    try:
        job = client.create_training_job("tiny", **CONFIG)
        train(job, random_batches(2, TINY_VOCAB, seed=23))
        job.save("mine").result()
        at_save = logprobs(job, probe)
        fill(small_disk, "filler")
        first.process.send_signal(signal.SIGTERM)
        first.process.wait(120)
        assert first.process.returncode == 0
        log = first.log()
        assert "could not save a checkpoint before the stop: the store refused" in log
        assert "Traceback" not in log

        (small_disk / "filler").unlink()
        second = backend_on(small_disk / "data", port)
        assert np.array_equal(logprobs(job, probe), at_save)
        assert client.get_job(job.job_id)["progress"]["resumed"]["checkpoint_id"] == "mine"
        job.cancel()
    finally:
        client.close()
        for backend in (first, second):
            if backend is not None:
                backend.stop()
