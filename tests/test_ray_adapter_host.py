"""Adapter hosts on the Ray executor, on a real Ray cluster on this machine (the head's own host "a", four
CPU slots, `--adapter-host`): the sub-jobs of one base on one device are slots of one actor, as they are of
one process locally. Two trainers of different ranks and a sampler share the actor and its base; each
trainer's numerics are in-process peft's, a weight sync lands in the hosted sampler (whose greedy tokens then equal the trainer's), checkpoints go through
the actor's staging to the head and back, each slot's log lines reach its own job, and the actor's death
fails every slot it served (`worker_crashed`) while the next job gets a new actor. The host's memory budget
holds there too, generates of slots waiting together share a decoding pass (`--batch-across-slots generate`),
and a hosted managed run survives a SIGTERM of the backend losing no step.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from cortex_nb import Client, ConflictError
from cortex_nb.demo_data import addition_problems

from .notebook_fixtures import wait_until
from .ray_cluster import start_ray_cluster
from .reference import ReferenceTrainer, random_batch, reference_base, reference_lora
from .test_adapter_host_budget import held_bytes, mib, slot_bytes
from .test_slot_batching import turn_held_by
from .training_data import text_batch, train

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY_VOCAB = 259
TOLERANCE = 1e-5
RANKS = {"narrow": (4, 8, 2e-2), "wide": (8, 16, 1e-2)}  # r, alpha, lr


def budget() -> int:
    """Room for the base, the module's slots (two trainers of ranks 4 and 8, a rank-8 sampler, a second
    rank-4 trainer) and half a rank-8 trainer more: a rank-16 trainer (twice a rank-8 one) must wait
    beside the first three, and a rank-64 one could never fit."""
    return (
        held_bytes(reference_base("tiny"))
        + 2 * slot_bytes(4)
        + slot_bytes(8)
        + slot_bytes(8) // 4
        + slot_bytes(8) // 2
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_ray_cluster(
        tmp_path_factory.mktemp("ray-hosts"),
        "--devices",
        "cpu:6",
        "--adapter-host",
        "--adapter-host-memory",
        str(budget()),
        "--batch-across-slots",
        "generate",
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_client(cluster):
    with cluster.client() as client:
        yield client


@pytest.fixture(scope="module")
def jobs(ray_client):
    """Two trainers (one with a sampler) on one base, with the in-process peft reference each must match."""
    made = {}
    for name, (r, alpha, lr) in RANKS.items():
        job = ray_client.create_training_job(
            "tiny",
            name=name,
            samplers=1 if name == "wide" else 0,
            lora={"r": r, "alpha": alpha},
            optimizer={"lr": lr},
            seed=5,
            wait=False,
        )
        made[name] = (
            job,
            ReferenceTrainer(reference_lora(reference_base("tiny"), r=r, alpha=alpha, seed=5), lr=lr),
        )
    for job, _ in made.values():
        job.wait_ready(timeout_s=600)
    yield made
    for job, _ in made.values():
        job.cancel()


def adapter_hosts(client) -> list[dict]:
    return client.get_capacity()["executor"]["adapter_hosts"]


def test_the_sub_jobs_of_one_base_are_slots_of_one_actor(ray_client, jobs):
    hosts = adapter_hosts(ray_client)
    assert ray_client.get_capacity()["executor"]["hosting"] == "adapter_host"
    assert len(hosts) == 1, hosts
    host = hosts[0]
    assert (host["host"], host["device"], host["base_model"], host["slots"]) == ("a", "a/cpu", "tiny", 3)
    assert host["base_bytes"] > 0 and host["slots_bytes"] > 0
    infos = [sub["info"] for job, _ in jobs.values() for sub in ray_client.get_job(job.job_id)["sub_jobs"]]
    assert len(infos) == 3
    assert {info["adapter_host"]["pid"] for info in infos} == {host["pid"]}
    assert {info["host"] for info in infos} == {"a"}


def test_each_slot_trains_as_in_process_peft_while_the_other_trains(jobs):
    rng = np.random.default_rng(11)
    for step in range(3):
        batch = random_batch(rng, TINY_VOCAB, batch=3, length=24)
        # Both slots' requests are in flight together: the host gives them turns.
        pending = {name: (job.forward_backward(batch), job.step()) for name, (job, _) in jobs.items()}
        for name, (_, reference) in jobs.items():
            expected, expected_logprobs = reference.train_step(batch)
            result = pending[name][0].result()
            assert result["loss"] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), (name, step)
            np.testing.assert_allclose(
                result["tensors"]["logprobs"], expected_logprobs, rtol=0, atol=TOLERANCE
            )
            assert pending[name][1].result()["step"] == step + 1


def test_a_weight_sync_lands_in_the_hosted_sampler(jobs):
    job, reference = jobs["wide"]
    train(job, [text_batch()] * 4)
    trained = job.generate(["the sampler"], sub_job="training-0", max_tokens=16, temperature=0.0).result()
    before = job.generate(["the sampler"], sub_job="sampling-0", max_tokens=16, temperature=0.0).result()
    assert before.tokens != trained.tokens, (
        "training must change the greedy output, or equality proves nothing"
    )
    synced = job.sync_sampler().result()
    assert synced["targets"][0]["sub_job_id"] == "sampling-0"
    after = job.generate(["the sampler"], sub_job="sampling-0", max_tokens=16, temperature=0.0).result()
    assert after.tokens == trained.tokens and after.weight_version == trained.weight_version


def test_generates_of_slots_waiting_on_the_actor_share_a_pass_and_equal_each_alone(ray_client, jobs):
    """While the narrow trainer's slot samples, the wide job's trainer and sampler slots wait with a generate
    each: the next pass takes both (`--batch-across-slots generate`), each through its own adapter."""
    narrow, wide = jobs["narrow"][0], jobs["wide"][0]
    params = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "logprobs": True}
    with turn_held_by(narrow):
        futures = [
            wide.generate([[5, 6, 7], [9]], sub_job=sub, **params) for sub in ("training-0", "sampling-0")
        ]
    together = [future.result() for future in futures]

    def passed_together() -> bool:  # the actor's log lines reach the head a moment later
        lines = [line["line"] for line in ray_client.tail_logs(wide.job_id)["lines"]]
        return any("2 requests of 2 slots sampled in one pass" in line for line in lines)

    wait_until(passed_together, 30)
    for sub, result in zip(("training-0", "sampling-0"), together, strict=True):
        alone = wide.generate([[5, 6, 7], [9]], sub_job=sub, **params).result()
        assert result.tokens == alone.tokens and result.weight_version == alone.weight_version
        for mine, theirs in zip(result.samples, alone.samples, strict=True):
            np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], rtol=0, atol=TOLERANCE)


def test_a_checkpoint_saved_in_one_slot_loads_in_another_job_on_the_host(cluster, ray_client, jobs):
    job, _ = jobs["narrow"]
    saved = job.save("hosted").result()
    assert [path for path in cluster.backend.data_dir.rglob("hosted") if path.is_dir()]
    probe = random_batch(np.random.default_rng(5), TINY_VOCAB, batch=2, length=12, pad_tail=False)
    expected = job.forward(probe).result()["tensors"]["logprobs"]
    other = ray_client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, seed=9, wait=False)
    try:
        other.wait_ready(timeout_s=600)
        assert adapter_hosts(ray_client)[0]["slots"] == 4
        loaded = other.load(saved["checkpoint_id"], source_job_id=job.job_id).result()
        assert loaded["checkpoint_id"] == "hosted"
        np.testing.assert_array_equal(other.forward(probe).result()["tensors"]["logprobs"], expected)
    finally:
        other.cancel()
    # Its slot leaves the actor once its worker has ended there (the others stay).
    wait_until(lambda: adapter_hosts(ray_client)[0]["slots"] == 3, 60)


def test_each_slots_log_lines_reach_its_own_job(ray_client, jobs):
    logs = {
        name: [line["line"] for line in ray_client.tail_logs(job.job_id)["lines"]]
        for name, (job, _) in jobs.items()
    }
    for name, lines in logs.items():
        assert any("forward_backward=" in line for line in lines), (name, lines[-5:])
        assert not any("\x1f" in line for line in lines), "a slot's tag reached the log"
    narrow, wide = jobs["narrow"][0].job_id, jobs["wide"][0].job_id
    assert not any(wide in line for line in logs["narrow"]) and not any(
        narrow in line for line in logs["wide"]
    )


def test_the_hosts_budget_holds_on_ray_a_slot_waits_for_room_or_never_fits(ray_client, jobs):
    waiting = ray_client.create_training_job("tiny", lora={"r": 16, "alpha": 32}, seed=2, wait=False)

    def queued() -> bool:
        job = ray_client.get_job(waiting.job_id)
        assert job["status"] in ("pending", "starting"), job
        return job["status"] == "pending" and "adapter-host memory" in (
            (job.get("queue") or {}).get("reason") or ""
        )

    wait_until(queued, 120)
    reason = ray_client.get_job(waiting.job_id)["queue"]["reason"]
    assert mib(slot_bytes(16)) in reason and mib(budget()) in reason, reason
    wait_until(lambda: adapter_hosts(ray_client)[0]["slots"] == 3, 60)  # the waiting slot left the actor
    waiting.cancel()
    never = ray_client.create_training_job("tiny", lora={"r": 64, "alpha": 128}, seed=2, wait=False)
    ended = ray_client.wait_for_job(never.job_id, ("failed",), timeout_s=120)
    assert ended["failure_code"] == "adapter_host_full" and "never fit" in ended["failure_message"], ended
    wait_until(lambda: adapter_hosts(ray_client)[0]["slots"] == 3, 60)  # the refused slot left the actor
    # The jobs already on the host were never disturbed.
    assert {ray_client.get_job(job.job_id)["status"] for job, _ in jobs.values()} == {"running"}


def test_the_actors_death_fails_every_slot_and_the_next_job_gets_a_new_actor(ray_client, jobs):
    pid = adapter_hosts(ray_client)[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    for job, _ in jobs.values():
        failed = ray_client.wait_for_job(job.job_id, ("failed",), timeout_s=120)
        assert failed["failure_code"] == "worker_crashed", failed
        assert "adapter host" in failed["failure_message"] and "3 slot(s)" in failed["failure_message"]
    with pytest.raises(ConflictError, match="worker_crashed"):
        jobs["narrow"][0].forward_backward(text_batch()).result()
    fresh = ray_client.create_training_job("tiny", lora={"r": 4, "alpha": 8}, seed=1, wait=False)
    try:
        fresh.wait_ready(timeout_s=600)
        hosts = adapter_hosts(ray_client)
        assert len(hosts) == 1 and hosts[0]["pid"] != pid and hosts[0]["slots"] == 1
        reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=4, alpha=8, seed=1), lr=1e-4)
        batch = random_batch(np.random.default_rng(2), TINY_VOCAB, batch=2, length=16)
        expected, _ = reference.train_step(batch)
        assert fresh.forward_backward(batch).result()["loss"] == pytest.approx(expected, rel=TOLERANCE)
    finally:
        fresh.cancel()


def run_through_a_restart(tmp_path, name: str, spec: dict, ready, stop) -> dict:
    """A managed run as a slot of a host actor on a Ray backend; once `ready(job)`, `stop(backend)` ends that
    backend, and a new one and its Ray head on the same data dir and port carry on: the run's progress once
    it completed in full (the client and its waiter ride through the restart)."""
    from .test_surviving_restarts import SPEC, Waiter, completed_in_full, free_port

    data_dir, port = tmp_path / "data", free_port()
    args = ("--port", str(port), "--adapter-host")
    first = start_ray_cluster(data_dir, *args)
    second = None
    client = Client(first.backend.url, first.backend.token, reconnect_s=300)
    try:
        job = client.train({**SPEC, "data": addition_problems(), **spec}, name=name)
        waiter = Waiter(job)
        waiter.start()
        wait_until(lambda: ready(job), 300, 0.05)
        assert adapter_hosts(client)[0]["slots"] == 1
        stop(first.backend)
        first.stop()
        second = start_ray_cluster(data_dir, *args)
        return completed_in_full(waiter, spec["steps"])
    finally:
        client.close()
        for cluster in (first, second):
            if cluster is not None:
                cluster.stop()


def test_sigterm_drains_a_hosted_run_on_ray_and_the_next_start_resumes_it_losing_no_step(tmp_path):
    """The survival path on Ray with the run a slot: the drain's checkpoint travels from the actor to the
    head, and the next backend (a new Ray head on the same data dir and port) resumes the run from it."""

    def drain(backend) -> None:
        backend.process.send_signal(signal.SIGTERM)
        backend.process.wait(120)
        assert backend.process.returncode == 0
        assert "drained in" in backend.log() and "Traceback" not in backend.log()

    progress = run_through_a_restart(
        tmp_path,
        "hosted-survivor",
        {"steps": 40},
        lambda job: (job.progress or {}).get("step", 0) >= 3,
        drain,
    )
    resumed = progress["resumed"]
    assert resumed["lost_steps"] == 0 and resumed["checkpoint_id"].startswith("drained-step-")


def test_kill_9_of_the_ray_backend_resumes_a_hosted_run_from_its_last_periodic_checkpoint(tmp_path):
    """No drain: the backend killed outright takes its Ray head and the host actor with it. The periodic
    checkpoints the actor sent the head survive, and the next backend resumes the run from the newest,
    stating the steps lost since."""
    from .test_surviving_restarts import past_a_checkpoint

    def crash(backend) -> None:
        backend.process.kill()  # as after a crash: no drain, no checkpoint first
        backend.process.wait(30)

    progress = run_through_a_restart(
        tmp_path, "hosted-crash", {"steps": 40, "save": {"every": 5}}, past_a_checkpoint, crash
    )
    resumed = progress["resumed"]
    assert resumed["checkpoint_id"] == f"step-{resumed['step']}" and resumed["step"] % 5 == 0
    assert resumed["lost_steps"] >= 1
    print(f"\nkill -9 on Ray, hosted: resumed from step {resumed['step']}, lost {resumed['lost_steps']}")
