"""Concurrent generates on one sub-job are sampled in one engine pass, and each request still gets exactly
the result it gets alone: tokens, seed, weight version, token counts (logprobs to float rounding)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cortex_nb import Client

from .backend_process import start_backend
from .reference import random_batch

# A generate that keeps the worker busy (other params, so never batched with the requests behind it) while
# the requests under test queue up behind it.
BLOCKER = {"max_tokens": 96, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    backend = start_backend(
        tmp_path_factory.mktemp("sample-batching"), "--devices", "cpu:1", "--worker-threads", "1"
    )
    try:
        with Client(backend.url, backend.token) as client:
            yield client
    finally:
        backend.stop()


@pytest.fixture(scope="module")
def job(client):
    """A training job with a trained adapter (so its weights are not the base's), sampled on its trainer."""
    job = client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, optimizer={"lr": 5e-2}, seed=3)
    job.forward_backward(random_batch(np.random.default_rng(5), 259, batch=2, length=16)).result()
    job.step().result()
    yield job
    job.cancel()


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 256, size=int(rng.integers(2, 12))).tolist() for _ in range(count)]


def _behind_a_blocker(job, prompt_lists, params_list):
    """Submit a busy generate, then the requests under test while it runs; their results in order."""
    blocker = job.generate([[7, 8, 9]], **BLOCKER)
    futures = [
        job.generate(prompts, **params) for prompts, params in zip(prompt_lists, params_list, strict=True)
    ]
    blocker.result()
    return [future.result() for future in futures]


def _latest_generates(client: Client, job, count: int) -> list[dict]:
    generates = [r for r in client.list_requests(job.job_id, limit=100) if r["op"] == "generate"]
    return sorted(generates, key=lambda r: r["created_at"])[-count:]


def _ran_together(requests: list[dict]) -> bool:
    """Whether the requests ran in one pass: every one had started before any finished (one at a time,
    each starts only after the one before it finished)."""
    return max(r["started_at"] for r in requests) < min(r["finished_at"] for r in requests)


def _assert_same(together, alone):
    assert together.tokens == alone.tokens
    assert [s["finish_reason"] for s in together.samples] == [s["finish_reason"] for s in alone.samples]
    assert [(s["prompt_index"], s["sample_index"]) for s in together.samples] == [
        (s["prompt_index"], s["sample_index"]) for s in alone.samples
    ]
    assert together.seed == alone.seed
    assert together.weight_version == alone.weight_version == 1
    assert together.raw["generated_tokens"] == alone.raw["generated_tokens"]
    for mine, theirs in zip(together.samples, alone.samples, strict=True):
        # Another batch shape rounds the same sums in another order: equal to fp32 rounding, not bit for bit.
        np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], rtol=0, atol=1e-5)


def test_eight_concurrent_greedy_requests_equal_each_alone(client, job):
    prompt_lists = [[prompt] for prompt in _prompts(8, seed=1)]
    params = {"max_tokens": 24, "temperature": 0.0, "logprobs": True, "stop": ["e"]}
    together = _behind_a_blocker(job, prompt_lists, [params] * 8)
    assert _ran_together(_latest_generates(client, job, 8))
    for prompts, result in zip(prompt_lists, together, strict=True):
        _assert_same(result, job.generate(prompts, **params).result())


def test_seeded_and_unseeded_sampled_requests_equal_each_alone(client, job):
    """Each request draws from its own seed: a seeded request, and an unseeded one replayed with the seed it
    reported, give alone what they gave batched (two prompts and three samples each)."""
    prompt_lists = [_prompts(2, seed=10 + index) for index in range(4)]
    params = {"max_tokens": 20, "temperature": 0.9, "top_p": 0.95, "n": 3, "logprobs": True}
    seeds = [101, 202, None, 303]
    params_list = [{**params, "seed": seed} for seed in seeds]
    together = _behind_a_blocker(job, prompt_lists, params_list)
    assert _ran_together(_latest_generates(client, job, 4))
    for prompts, seed, result in zip(prompt_lists, seeds, together, strict=True):
        if seed is not None:
            assert result.seed == seed
        _assert_same(result, job.generate(prompts, **{**params, "seed": result.seed}).result())
    # The draws differ between requests (each its own seed), so none merely repeated another's.
    assert len({str(result.tokens) for result in together}) == 4


def test_a_different_request_in_between_keeps_submission_order(client, job):
    """Only the unbroken run of compatible generates at the head of the queue goes together: a generate
    with other params in between starts after the first pair is answered, and the last pair after it."""
    prompt_lists = [[prompt] for prompt in _prompts(5, seed=20)]
    same = {"max_tokens": 8, "temperature": 0.0}
    other = {"max_tokens": 9, "temperature": 0.0}
    _behind_a_blocker(job, prompt_lists, [same, same, other, same, same])
    first, second, between, fourth, fifth = _latest_generates(client, job, 5)
    assert _ran_together([first, second]) and _ran_together([fourth, fifth])
    assert between["started_at"] >= max(first["finished_at"], second["finished_at"])
    assert min(fourth["started_at"], fifth["started_at"]) >= between["finished_at"]


def test_a_request_cancelled_during_a_shared_pass_ends_cancelled_and_the_others_finish(client, job):
    """The pass goes on for the requests still wanted; the cancelled one is answered `cancelled`."""
    params = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    blocker = job.generate([[7, 8, 9]], **BLOCKER)
    futures = [job.generate([prompt], **params) for prompt in _prompts(3, seed=30)]
    blocker.result()
    deadline = time.monotonic() + 30
    while any(future.status()["status"] == "queued" for future in futures):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    futures[1].cancel()
    first, third = futures[0].result(), futures[2].result()
    assert [len(tokens) for tokens in first.tokens + third.tokens] == [400, 400]
    assert futures[1].status()["status"] == "cancelled"
    assert _ran_together(_latest_generates(client, job, 3))


def test_eight_concurrent_one_sample_requests_cost_about_one_eight_sample_request(client, job):
    """A loose ratio (speed itself is measured in bench/bench_sample_batching.py): eight 1-sample requests
    sent at once take less than twice one 8-sample request's time; one at a time they took 4.6 times."""
    params = {"max_tokens": 48, "temperature": 1.0, "ignore_eos": True}
    prompt = [3, 1, 4, 1, 5]

    def eight_at_once() -> float:
        started = time.perf_counter()
        futures = [job.generate([prompt], **params) for _ in range(8)]
        for future in futures:
            future.result()
        return time.perf_counter() - started

    def one_request_of_eight() -> float:
        started = time.perf_counter()
        job.generate([prompt], n=8, **params).result()
        return time.perf_counter() - started

    one_request_of_eight()  # warm up
    concurrent = min(eight_at_once() for _ in range(3))
    single = min(one_request_of_eight() for _ in range(3))
    assert concurrent / single < 2.0


def test_only_generates_that_differ_in_prompts_and_seed_share_a_pass():
    from cortex_backend.sample_batching import batch_key
    from cortex_backend.worker_messages import Request

    from cortex_nb.protocol.schemas.sampling import SamplingParams

    def key(adapter=None, stream=False, prompts=((1, 2),), **sampling):
        params = {
            "prompt_tokens": [list(p) for p in prompts],
            "sampling_params": SamplingParams(**sampling).model_dump(),
        }
        if adapter is not None:
            params["adapter"] = adapter
        if stream:
            params["stream"] = True
        return batch_key(Request("r", "generate", params))

    base = key(temperature=0.7)
    assert base is not None
    assert key(temperature=0.7, seed=5, prompts=((3,), (4, 5))) == base
    assert key(temperature=0.8) != base
    assert key(temperature=0.7, n=2) != base
    assert key(temperature=0.7, adapter="base") != base
    assert key(temperature=0.7, stream=True) is None
    assert key(temperature=0.7, prompt_logprobs=True) is None
    assert batch_key(Request("r", "forward", {})) is None
