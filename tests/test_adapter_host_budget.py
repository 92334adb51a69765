"""Admission by bytes on an adapter host (`--adapter-host-memory`): a slot whose adapter, gradients and
optimizer moments would pass the host's budget waits in the queue, saying so with the bytes, and starts once
a slot of that host ends, training exactly as it would alone; a smaller slot fits beside the others (bytes,
not slots); a slot that could never fit, not even on an empty host, fails at once with `adapter_host_full`.
The budget is set from in-process peft's own count of the same base and adapters, so the host's measure is
checked as well."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cortex_nb import Client

from .backend_process import start_backend
from .reference import reference_base, reference_lora
from .test_adapter_host import batches

RANK = 16


def held_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def slot_bytes(r: int) -> int:
    """Adapter, gradients and AdamW's two moments: four times the LoRA tensors' bytes."""
    model = reference_lora(reference_base("tiny"), r=r, alpha=2 * r, seed=0)
    return 4 * sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "lora_" in name)


def mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


@pytest.fixture(scope="module")
def budget_backend(tmp_path_factory):
    """Adapter-host mode with a budget for the base and about one and a half rank-16 slots."""
    budget = held_bytes(reference_base("tiny")) + slot_bytes(RANK) + slot_bytes(RANK) // 2
    process = start_backend(
        tmp_path_factory.mktemp("adapter-host-budget"),
        "--adapter-host",
        "--adapter-host-memory",
        str(budget),
        "--devices",
        "cpu:8",
        "--worker-threads",
        "1",
    )
    process.budget = budget
    yield process
    process.stop()


@pytest.fixture(scope="module")
def budget_client(budget_backend) -> Client:
    with Client(budget_backend.url, budget_backend.token) as client:
        yield client


def create(client: Client, r: int, seed: int = 0, wait: bool = True):
    return client.create_training_job(
        "tiny", lora={"r": r, "alpha": 2 * r}, optimizer={"lr": 1e-2}, seed=seed, wait=wait
    )


def train(job, seed: int) -> list[tuple]:
    out = []
    for batch in batches(seed):
        result = job.forward_backward(batch).result()
        step = job.step().result()
        out.append((result["loss"], result["tensors"]["logprobs"], step["grad_norm"]))
    return out


def slot_of(client: Client, job_id: str) -> dict:
    return client.get_job(job_id)["sub_jobs"][0]["info"]


def waits(job) -> list[str]:
    """The host's lines in the job's log saying its slot did not fit yet (one per try)."""
    return [line["line"] for line in job.logs()["lines"] if "slot waits" in line["line"]]


def wait_until(check, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_a_slot_past_the_budget_waits_in_the_queue_then_trains_as_alone_once_a_slot_ends(
    budget_client: Client, budget_backend, client: Client
):
    base, big, small = held_bytes(reference_base("tiny")), slot_bytes(RANK), slot_bytes(4)
    assert small * 2 < big  # the small slot fits where half a big one would
    first = create(budget_client, RANK)
    # The host measures what peft counts in process.
    info = slot_of(budget_client, first.job_id)
    assert info["slot_bytes"] == big and info["adapter_host"]["base_bytes"] == base

    # Bytes, not slots: a rank-4 slot fits beside the first, on the same host.
    beside = create(budget_client, 4)
    assert slot_of(budget_client, beside.job_id)["slot_bytes"] == small
    assert slot_of(budget_client, beside.job_id)["pid"] == info["pid"]
    beside.cancel()
    budget_client.wait_for_job(beside.job_id, until=("cancelled", "failed", "done"), timeout_s=120)

    # A second rank-16 slot does not fit beside the first: its job goes back to the queue and says why.
    second = create(budget_client, RANK, seed=11, wait=False)

    def waiting() -> dict | None:
        job = budget_client.get_job(second.job_id)
        assert job["status"] in ("pending", "starting"), job
        reason = (job.get("queue") or {}).get("reason") or ""
        return job if job["status"] == "pending" and "adapter-host memory" in reason else None

    queued = wait_until(waiting)
    reason = queued["queue"]["reason"]
    assert "--adapter-host-memory" in reason, reason
    for count in (big, base, budget_backend.budget):  # the slot's, the base's, the other slot's, the budget
        assert mib(count) in reason, (mib(count), reason)
    assert queued["failure_code"] is None and queued["queue"]["position"] == 1
    assert budget_client.get_capacity()["pending"] == 1

    # It stays queued while the first trains, tried once only: nothing frees on its host meanwhile.
    train(first, seed=3)
    job = budget_client.get_job(second.job_id)
    assert job["status"] == "pending" and "adapter-host memory" in job["queue"]["reason"], job
    assert len(waits(second)) == 1, waits(second)

    # The first ends: the second starts on the same host and trains exactly as it would alone.
    first.cancel()
    running = budget_client.wait_for_job(second.job_id, timeout_s=120)
    assert running["status"] == "running", running
    assert slot_of(budget_client, second.job_id)["slot_bytes"] == big
    hosted = train(budget_client.training_job(second.job_id), seed=11)
    alone_job = create(client, RANK, seed=11)
    try:
        alone = train(alone_job, seed=11)
    finally:
        alone_job.cancel()
    for (loss, logprobs, grad_norm), (loss_alone, logprobs_alone, grad_norm_alone) in zip(
        hosted, alone, strict=True
    ):
        assert loss == loss_alone and grad_norm == grad_norm_alone
        assert np.array_equal(logprobs, logprobs_alone)
    assert len(waits(second)) == 1, waits(second)
    second.cancel()


def test_a_slot_that_could_never_fit_fails_at_once_with_adapter_host_full(
    budget_client: Client, budget_backend
):
    """Rank 64: four times a rank-16 slot, more than the whole budget beside the base alone."""
    huge = slot_bytes(64)
    assert held_bytes(reference_base("tiny")) + huge > budget_backend.budget
    job = create(budget_client, 64, wait=False)
    ended = budget_client.wait_for_job(job.job_id, timeout_s=120)
    assert ended["status"] == "failed" and ended["failure_code"] == "adapter_host_full", ended
    message = ended["failure_message"]
    assert "never fit" in message and "--adapter-host-memory" in message, message
    assert mib(huge) in message and mib(budget_backend.budget) in message, message


def test_on_a_gpu_without_a_budget_the_devices_free_memory_bounds_what_a_slot_still_allocates():
    from cortex_backend.host_budget import check_slot

    gib = 2**30
    # 40 GiB of 80 free, a 5% reserve: a slot that still needs 30 GiB fits, one that needs 37 GiB does not.
    fits = check_slot(32 * gib, 2 * gib, 16 * gib, 0, 0, None, (40 * gib, 80 * gib))
    refused = check_slot(39 * gib, 2 * gib, 16 * gib, 0, 0, None, (40 * gib, 80 * gib))
    assert fits is None
    assert refused is not None and refused.code == "adapter_host_full" and refused.fits_later
    assert "37,888.0 MiB" in refused.message and "36,864.0 MiB free" in refused.message
    # Beside a 16 GiB base, a 62 GiB slot could never fit in 80 GiB less the reserve: it fails, not waits.
    never = check_slot(62 * gib, 2 * gib, 16 * gib, 0, 0, None, (40 * gib, 80 * gib))
    assert never is not None and not never.fits_later and "never fit" in never.message
    # Off a GPU and without a budget nothing is checked.
    assert check_slot(10**15, 0, 10**15, 10**15, 3, None, None) is None


def test_jobs_that_wake_each_other_back_off_and_a_slot_freed_while_one_starts_is_not_missed():
    """Bookkeeping of room waits (room_waits.py), on a fake clock."""
    from cortex_backend.room_waits import RoomWaits

    now = [100.0]
    room = RoomWaits(clock=lambda: now[0])
    # Two jobs, each partly started on cpu:0 (a sampler slot loaded), each refused for its trainer.
    for job in ("a", "b"):
        room.admitted(job, ["cpu:0"])
        room.slot_ready(job, "cpu:0")
    room.refused("a", "cpu:0", "needs 4 MiB")
    room.refused("b", "cpu:0", "needs 4 MiB")
    assert room.holds("a") and room.holds("b") and room.reason("a") == "needs 4 MiB"
    # a's workers stop: that wakes b (not a itself), after b's backoff.
    assert room.released("a") == [0.5]
    assert room.holds("b") and room.holds("a")
    now[0] += 0.5
    assert not room.holds("b") and room.holds("a")
    # b is tried, refused again: its backoff doubles; its workers stopping wake a.
    room.admitted("b", ["cpu:0"])
    room.slot_ready("b", "cpu:0")
    room.refused("b", "cpu:0", "needs 4 MiB")
    assert room.released("b") == [] and not room.holds("a")  # a's backoff has passed: tried now
    assert room.retry_in("b") is None  # b waits for a slot to free again
    room.admitted("a", ["cpu:0"])
    room.slot_ready("a", "cpu:0")
    room.refused("a", "cpu:0", "needs 4 MiB")
    assert room.released("a") == [1.0]  # b's second refusal in a row: 1 s
    # A job that runs starts its backoff afresh; one that ends is forgotten.
    room.ran("b")
    room.forget("a")
    assert room.reason("a") is None

    # A slot of the device freed between a job's admission and its refusal: it is tried again (no wake-up
    # would come otherwise), after its backoff.
    room.admitted("c", ["cpu:1"])
    room.admitted("d", ["cpu:1"])
    room.slot_ready("d", "cpu:1")
    room.released("d")
    room.refused("c", "cpu:1", "needs 4 MiB")
    assert room.retry_in("c") == 0.5
