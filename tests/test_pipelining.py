"""Requests queue per sub-job in submission order: pipelined calls equal calls made one by one,
and many clients on separate jobs work at the same time."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cortex_nb import Client

from .reference import random_batch


def _batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(21)
    return [random_batch(rng, 259, batch=2, length=16) for _ in range(count)]


def test_twenty_pipelined_pairs_complete_in_order_and_match_sequential(client: Client):
    batches = _batches(20)
    pipelined = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=4)
    sequential = client.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=4)
    try:
        # Submit all 40 requests before reading a single result.
        futures = [(pipelined.forward_backward(b), pipelined.step()) for b in batches]
        piped = [(fb.result()["loss"], st.result()["step"]) for fb, st in futures]
        one_by_one = []
        for b in batches:
            loss = sequential.forward_backward(b).result()["loss"]
            one_by_one.append((loss, sequential.step().result()["step"]))
        assert [step for _, step in piped] == list(range(1, 21))
        np.testing.assert_allclose([loss for loss, _ in piped], [loss for loss, _ in one_by_one], rtol=1e-6)
        # The backend ran them in submission order: each started after the previous one finished.
        requests = sorted(client.list_requests(pipelined.job_id, limit=100), key=lambda r: r["created_at"])
        starts = [r["started_at"] for r in requests]
        finishes = [r["finished_at"] for r in requests]
        assert all(starts[i] >= finishes[i - 1] for i in range(1, len(requests)))
    finally:
        pipelined.cancel()
        sequential.cancel()


def test_ten_concurrent_clients_on_separate_jobs(backend):
    results: dict[int, object] = {}

    def work(index: int) -> None:
        try:
            with Client(backend.url, backend.token) as own:
                with own.create_training_job("tiny", optimizer={"lr": 1e-2}, seed=index) as job:
                    batch = _batches(1)[0]
                    losses = []
                    for _ in range(3):
                        fb, st = job.forward_backward(batch), job.step()
                        losses.append(fb.result()["loss"])
                        st.result()
                    text = job.generate(["hi"], max_tokens=4, temperature=0).result().texts[0]
                    results[index] = (losses, text, job.job_id)
        except Exception as exc:  # collected and asserted below, with the reason
            results[index] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    failures = {i: r for i, r in results.items() if isinstance(r, Exception)}
    assert not failures, failures
    assert len(results) == 10
    assert len({r[2] for r in results.values()}) == 10
    for losses, _, _ in results.values():
        assert losses[2] < losses[0]  # each job actually trained


@pytest.mark.parametrize("op", ["generate"])
def test_cancel_a_queued_request(client: Client, op):
    sampler = client.create_sampler("tiny")
    try:
        slow = sampler.generate(["x"] * 8, max_tokens=400, temperature=1.0, seed=1, ignore_eos=True)
        queued = sampler.generate(["y"], max_tokens=5)
        cancelled = queued.cancel()
        assert cancelled["status"] == "cancelled"
        interrupted = slow.cancel()
        assert interrupted["status"] in ("running", "cancelled", "succeeded")
        with pytest.raises(Exception) as info:
            queued.result()
        assert getattr(info.value, "code", None) == "cancelled"
        # The sub-job still serves requests after cancellations.
        assert sampler.generate(["z"], max_tokens=3, temperature=0).result().samples
    finally:
        sampler.cancel()
