"""An adapter host with `--batch-across-slots all`: generates (and forward_backwards) of several slots that
wait for the host's turn together go in one pass, each through its own slot's adapter, and each request
still gets what it gets alone (tokens, seed, its own slot's weight version; logprobs, losses and trained
adapters to float rounding). A request cancelled
while it waits ends cancelled and its neighbours finish. With `auto` a CPU host never does it, so its slots
stay bitwise those of the jobs alone, and a GPU host batches generates only."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cortex_nb import Client
from cortex_nb.errors import RequestFailed
from cortex_nb.views import adapter_host_lines

from .backend_process import start_backend
from .notebook_fixtures import wait_until
from .reference import random_batch
from .test_sample_batching import _prompts, _ran_together

# (rank, alpha, targets, learning rate, steps): slots that differ in every LoRA setting and weight version.
SLOTS = [
    (4, 8, "all-linear", 5e-2, 1),
    (8, 16, ["q_proj", "v_proj"], 2e-2, 2),
    (2, 4, ["o_proj", "down_proj"], 8e-2, 3),
    (16, 8, "all-linear", 3e-2, 1),
]
OOM_JOB = "job-oom-slot"  # its generates run out of memory, alone or in a shared pass
GREEDY = {"max_tokens": 20, "temperature": 0.0, "logprobs": True, "ignore_eos": True}


def trained_jobs(client: Client) -> list:
    jobs = []
    for index, (r, alpha, targets, lr, steps) in enumerate(SLOTS):
        job = client.create_training_job(
            "tiny", lora={"r": r, "alpha": alpha, "target_modules": targets}, optimizer={"lr": lr}, seed=index
        )
        rng = np.random.default_rng(index)
        for _ in range(steps):
            job.forward_backward(random_batch(rng, 259, batch=2, length=12)).result()
            job.step().result()
        jobs.append(job)
    return jobs


@pytest.fixture(scope="module")
def slot_jobs(tmp_path_factory):
    backend = start_backend(
        tmp_path_factory.mktemp("slot-batching"),
        "--adapter-host",
        "--batch-across-slots",
        "all",
        "--devices",
        "cpu:4",
        "--worker-threads",
        "1",
        "--fault-injection",
        f"oom_generate={OOM_JOB}",
    )
    try:
        with Client(backend.url, backend.token) as client:
            jobs = trained_jobs(client)
            yield client, jobs
            for job in jobs:
                job.cancel()
    finally:
        backend.stop()


@contextlib.contextmanager
def turn_held_by(job) -> Iterator[None]:
    """A long generate on `job`'s slot holds the host's turn while the body submits requests. Once they
    have had ample time to reach their slots (and wait there, offering), it is cancelled: the turn goes on
    and they meet. No race with the generate's own length, however loaded the machine."""
    blocker = job.generate([[7, 8, 9]], max_tokens=1800, temperature=0.0, ignore_eos=True)
    wait_until(lambda: blocker.status()["status"] == "running", 60)
    yield
    time.sleep(1.0)
    blocker.cancel()


def behind_a_blocker(blocked_on, jobs, prompt_lists, params_list):
    """`jobs`' generates wait together while `blocked_on`'s slot holds the host's turn."""
    with turn_held_by(blocked_on):
        return [
            job.generate(prompts, **params)
            for job, prompts, params in zip(jobs, prompt_lists, params_list, strict=True)
        ]


def request_record(client: Client, job, future) -> dict:
    return next(
        r for r in client.list_requests(job.job_id, limit=100) if r["request_id"] == future.request_id
    )


def pass_lines(client: Client, job) -> list[str]:
    return [line["line"] for line in job.logs()["lines"] if "slots sampled in one pass" in line["line"]]


def assert_as_alone(together, alone, weight_version: int) -> None:
    assert together.tokens == alone.tokens
    assert together.seed == alone.seed
    assert together.weight_version == alone.weight_version == weight_version
    assert together.raw["generated_tokens"] == alone.raw["generated_tokens"]
    for mine, theirs in zip(together.samples, alone.samples, strict=True):
        np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], rtol=0, atol=1e-5)


def test_greedy_generates_of_three_slots_share_a_pass_and_equal_each_alone(slot_jobs):
    client, jobs = slot_jobs
    waiting = jobs[1:]
    prompt_lists = [_prompts(2, seed=20 + index) for index in range(len(waiting))]
    futures = behind_a_blocker(jobs[0], waiting, prompt_lists, [GREEDY] * len(waiting))
    together = [future.result() for future in futures]
    records = [request_record(client, job, future) for job, future in zip(waiting, futures, strict=True)]
    assert _ran_together(records)
    for job in waiting:
        assert any("3 requests of 3 slots" in line for line in pass_lines(client, job))
    for job, slot, prompts, result in zip(waiting, SLOTS[1:], prompt_lists, together, strict=True):
        assert_as_alone(result, job.generate(prompts, **GREEDY).result(), weight_version=slot[4])
    # Each slot sampled through its own adapter: the same prompts give other tokens on each.
    same = [job.generate([[5, 17, 30]], **GREEDY).result().tokens for job in jobs]
    assert len({str(tokens) for tokens in same}) == len(jobs)


def test_seeded_samples_of_slots_in_one_pass_equal_each_alone(slot_jobs):
    client, jobs = slot_jobs
    params = {"max_tokens": 16, "temperature": 0.8, "top_k": 40, "n": 2, "logprobs": True}
    waiting = [jobs[3], jobs[2], jobs[1]]
    seeds = [7, None, 9]
    prompt_lists = [_prompts(2, seed=30 + index) for index in range(3)]
    futures = behind_a_blocker(jobs[0], waiting, prompt_lists, [{**params, "seed": seed} for seed in seeds])
    together = [future.result() for future in futures]
    assert _ran_together([request_record(client, job, f) for job, f in zip(waiting, futures, strict=True)])
    for job, slot, prompts, seed, result in zip(
        waiting, [SLOTS[3], SLOTS[2], SLOTS[1]], prompt_lists, seeds, together, strict=True
    ):
        if seed is not None:
            assert result.seed == seed
        alone = job.generate(prompts, **{**params, "seed": result.seed}).result()
        assert_as_alone(result, alone, weight_version=slot[4])


def test_a_request_cancelled_while_it_waits_ends_cancelled_and_its_neighbours_finish(slot_jobs):
    client, jobs = slot_jobs
    with turn_held_by(jobs[0]):
        futures = [job.generate([[3, 4, 5]], **GREEDY) for job in jobs[1:]]
        futures[1].cancel()
    first, third = futures[0].result(), futures[2].result()
    assert [len(tokens) for tokens in first.tokens + third.tokens] == [20, 20]
    assert futures[1].status()["status"] == "cancelled"
    finished = [jobs[1], jobs[3]], [futures[0], futures[2]]
    assert _ran_together([request_record(client, job, f) for job, f in zip(*finished, strict=True)])


def test_an_out_of_memory_in_a_shared_pass_fails_only_its_own_request(slot_jobs):
    """The pass of three slots fails (one slot's generate runs out of memory): each request runs again
    alone, so that slot's request fails `out_of_memory` and its neighbours get what they get alone."""
    client, jobs = slot_jobs
    oom = client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, seed=7, job_id=OOM_JOB)
    try:
        waiting = [jobs[1], oom, jobs[3]]
        with turn_held_by(jobs[0]):
            futures = [job.generate([[4, 5, 6]], **GREEDY) for job in waiting]
        with pytest.raises(RequestFailed) as failed:
            futures[1].result()
        assert failed.value.code == "out_of_memory"
        for job, future in ((jobs[1], futures[0]), (jobs[3], futures[2])):
            assert future.result().tokens == job.generate([[4, 5, 6]], **GREEDY).result().tokens
            lines = [line["line"] for line in job.logs()["lines"]]
            assert any("a pass of 3 slots failed (RuntimeError: CUDA out of memory" in line for line in lines)
    finally:
        oom.cancel()


def test_forward_backwards_of_three_slots_share_a_pass_and_train_as_each_alone(slot_jobs):
    """Three fresh jobs train in one pass while another slot holds the turn; their twins (same specs and
    seeds, on the same host) train one request at a time: the same losses, logprobs and, after a step,
    the same adapters (read back through a forward), to float rounding."""
    client, jobs = slot_jobs

    def fresh() -> list:
        return [
            client.create_training_job(
                "tiny",
                lora={"r": r, "alpha": alpha, "target_modules": targets},
                optimizer={"lr": lr},
                seed=50 + i,
            )
            for i, (r, alpha, targets, lr, _) in enumerate(SLOTS[1:])
        ]

    together, alone = fresh(), fresh()
    try:
        rng = np.random.default_rng(8)
        batches = [random_batch(rng, 259, batch=1 + index, length=12) for index in range(3)]
        with turn_held_by(jobs[0]):
            futures = [job.forward_backward(batch) for job, batch in zip(together, batches, strict=True)]
        results = [future.result() for future in futures]
        records = [request_record(client, job, f) for job, f in zip(together, futures, strict=True)]
        assert _ran_together(records)
        for job in together:
            lines = [line["line"] for line in job.logs()["lines"]]
            assert any("forward_backward: 3 requests of 3 slots in one pass" in line for line in lines)
            assert any("forward_backward=1 summed_loss=" in line for line in lines)
        probe = random_batch(np.random.default_rng(9), 259, batch=2, length=12)
        for job, twin, batch, result in zip(together, alone, batches, results, strict=True):
            expected = twin.forward_backward(batch).result()
            np.testing.assert_allclose(result["loss"], expected["loss"], rtol=1e-5)
            np.testing.assert_allclose(
                result["tensors"]["logprobs"], expected["tensors"]["logprobs"], rtol=1e-5, atol=1e-6
            )
            job.step().result()
            twin.step().result()
            np.testing.assert_allclose(
                job.forward(probe).result()["tensors"]["logprobs"],
                twin.forward(probe).result()["tensors"]["logprobs"],
                rtol=1e-5,
                atol=1e-5,
            )
    finally:
        for job in together + alone:
            job.cancel()


def test_capacity_says_what_the_host_batches(slot_jobs):
    client, _ = slot_jobs
    executor = client.get_capacity()["executor"]
    assert executor["batch_across_slots"] == "all"
    [host] = executor["adapter_hosts"]
    assert host["batched_operations"] == ["forward_backward", "generate"]
    [line] = adapter_host_lines(client.get_capacity())
    assert line.endswith("; generate and forward_backward batched across slots")


def test_auto_batches_generates_across_slots_on_a_gpu_only():
    import torch
    from cortex_backend.adapter_host import host_batches
    from cortex_backend.slot_batching import batched_operations

    for on_gpu in (False, True):
        assert batched_operations("all", on_gpu) == {"generate", "forward_backward"}
        assert batched_operations("generate", on_gpu) == {"generate"}
        assert batched_operations("off", on_gpu) == set()
    assert batched_operations("auto", True) == {"generate"} and batched_operations("auto", False) == set()
    assert host_batches("auto") == batched_operations("auto", torch.cuda.is_available())
