"""A training sub-job across devices (`n_gpus: 2`) on the Ray executor, on a real Ray cluster whose one host
("a", the head) has two CPU slots: two rank actors placed together by a placement group train as one
process does, save one adapter, and fail together (freeing both slots) when one rank's actor is killed.
`python -m pytest -m ray` runs these with the other Ray tests."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from .ray_cluster import start_ray_cluster
from .reference import ReferenceTrainer, reference_base, reference_lora
from .training_data import random_batches

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY_VOCAB = 259
LORA = {"r": 8, "alpha": 16}
SEED = 3
LR = 1e-2
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_ray_cluster(tmp_path_factory.mktemp("ray-ranks"), "--devices", "cpu:2")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_client(cluster):
    with cluster.client() as client:
        yield client


def _two_ranks(client):
    job = client.create_training_job("tiny", n_gpus=2, lora=LORA, optimizer={"lr": LR}, seed=SEED, wait=False)
    job.wait_ready(timeout_s=600)
    return job


def _slots_in_use_once_settled(client, wait_s: float = 60.0) -> int:
    deadline = time.monotonic() + wait_s
    while client.get_capacity()["slots_in_use"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return client.get_capacity()["slots_in_use"]


def _gone(pid: int, wait_s: float = 30.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_two_rank_actors_train_as_one_process_does(ray_client, tmp_path):
    from peft import PeftModel, get_peft_model_state_dict

    assert ray_client.get_capacity()["slots_total"] == 2
    batches = random_batches(3, TINY_VOCAB, rows=2, length=24, seed=5)
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), 8, 16, SEED), LR)
    job = _two_ranks(ray_client)
    try:
        info = ray_client.get_job(job.job_id)["sub_jobs"][0]["info"]
        assert info["sharding"] == {"strategy": "fsdp2", "world_size": 2, "rank": 0}
        assert info["host"] == "a"
        ranks = info["ranks"]
        assert [(rank["rank"], rank["device"]) for rank in ranks] == [(0, "a/cpu"), (1, "a/cpu")]
        pids = [rank["pid"] for rank in ranks]
        assert len(set(pids)) == 2 and pids[0] == info["pid"]
        assert all(rank["base_bytes"] > 0 for rank in ranks)
        assert ray_client.get_capacity()["slots_in_use"] == 2
        for batch in batches:
            expected, _ = reference.train_step(batch)
            result = job.forward_backward(batch).result(timeout_s=300)
            job.step().result(timeout_s=300)
            assert result["loss"] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE)
            # Each rank computed one of the two datums: both actors trained, in one process group.
            assert [(r["rank"], r["datums"], r["tokens"]) for r in result["ranks"]] == [
                (0, 1, 24),
                (1, 1, 24),
            ]
        # The export is one whole adapter (rank 0 writes it, gathered from both), the reference's weights.
        exported = job.export(tmp_path / "adapter")
        weights = load_file(exported / "adapter_model.safetensors")
        live = {name: value.detach() for name, value in get_peft_model_state_dict(reference.model).items()}
        assert sorted(weights) == sorted(live)
        for name, value in live.items():
            torch.testing.assert_close(weights[name], value, atol=TOLERANCE, rtol=0)
        loaded = PeftModel.from_pretrained(reference_base("tiny"), str(exported))
        assert any("lora_" in name for name, _ in loaded.named_parameters())
        logs = "\n".join(line["line"] for line in ray_client.tail_logs(job.job_id, limit=5000)["lines"])
        assert "[rank 0]" in logs and "[rank 1]" in logs
    finally:
        job.cancel()
    assert _slots_in_use_once_settled(ray_client) == 0
    assert all(_gone(pid) for pid in pids)


def test_a_killed_rank_actor_fails_the_sub_job_and_frees_both_slots(ray_client):
    assert _slots_in_use_once_settled(ray_client) == 0
    job = _two_ranks(ray_client)
    pids = [rank["pid"] for rank in ray_client.get_job(job.job_id)["sub_jobs"][0]["info"]["ranks"]]
    assert ray_client.get_capacity()["slots_in_use"] == 2
    job.forward_backward(random_batches(1, TINY_VOCAB, seed=1)[0]).result(timeout_s=300)
    os.kill(pids[1], signal.SIGKILL)
    failed = ray_client.wait_for_job(job.job_id, ("failed",), timeout_s=120)
    assert failed["failure_code"] == "worker_crashed"
    assert "rank 1 of 2" in failed["failure_message"] and f"pid {pids[1]}" in failed["failure_message"]
    assert _slots_in_use_once_settled(ray_client) == 0
    assert _gone(pids[0]), "rank 0's actor must be stopped with the sub-job"
    # Ray's resources are free again too: a new two-rank group is placed on the same host (with its
    # predecessor's placement group still there, it would wait and fail `exceeds_capacity`).
    again = _two_ranks(ray_client)
    try:
        assert (
            len(
                again.forward_backward(random_batches(1, TINY_VOCAB, seed=2)[0]).result(timeout_s=300)[
                    "ranks"
                ]
            )
            == 2
        )
    finally:
        again.cancel()
