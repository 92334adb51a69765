"""The Ray executor on a real three-host Ray cluster on this machine (hosts a, b, c; one CPU slot each; c
alone has small-gpt2): the core paths with the trainer and the sampler on different hosts, an actor
killed mid-request, a host lost mid-request with jobs queued for it, and `host join` refusing a host
whose versions differ. `python -m pytest -m ray` runs these alone.

The tests share one cluster and run in order: the trainer/sampler job of the first tests holds hosts a
and b until the lost-host test cancels it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cortex_nb import ConflictError, RequestFailed
from cortex_nb.demo_data import addition_problems
from cortex_nb.protocol.states import JOB_PENDING

from .ray_cluster import start_ray_cluster
from .reference import ReferenceTrainer, random_batch, reference_base, reference_logprobs, reference_lora
from .test_generate import hf_greedy
from .training_data import text_batch, train

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LR = 1e-2
TOLERANCE = 1e-5
TINY_VOCAB = 259
HOST_FIELDS = {"cpu_percent", "ram_used_bytes", "ram_total_bytes"}
LONG_GENERATE = {"max_tokens": 1500, "temperature": 1.0, "ignore_eos": True}
MANAGED_SPEC = {
    "base_model": "tiny",
    "steps": 3,
    "batch_size": 4,
    "max_seq_len": 16,
    "lora": {"r": 4, "alpha": 8},
    "save": {"every": 2},
    "seed": 1,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, gpt2_dir):
    cluster = start_ray_cluster(tmp_path_factory.mktemp("ray-backend"))
    try:
        cluster.join("b", wait=False)
        cluster.join("c", "--model", f"small-gpt2={gpt2_dir}", wait=False)
        cluster.wait_for_hosts(lambda names: names == {"a", "b", "c"}, "hosts b and c to join")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_client(cluster):
    with cluster.client() as client:
        yield client


@pytest.fixture(scope="module")
def pair(ray_client):
    """A trainer and a sampler (they land on two hosts: each host has one slot), with the in-process
    peft reference the trainer must match."""
    job = ray_client.create_training_job(
        "tiny", samplers=1, lora={"r": 8, "alpha": 16}, optimizer={"lr": LR}, seed=3, wait=False
    )
    job.wait_ready(timeout_s=600)
    reference = ReferenceTrainer(reference_lora(reference_base("tiny"), r=8, alpha=16, seed=3), lr=LR)
    yield job, reference
    job.cancel()


def host_of(client, job_id: str) -> dict[str, str]:
    return {sub["sub_job_id"]: sub["info"]["host"] for sub in client.get_job(job_id)["sub_jobs"]}


def wait_for_status(client, job_id: str, statuses: tuple[str, ...], timeout_s: float = 300.0) -> dict:
    return client.wait_for_job(job_id, statuses, timeout_s=timeout_s)


def wait_until_started(client, job_id: str, request_id: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get_request_status(job_id, request_id)["status"] == "queued":
        assert time.monotonic() < deadline, f"request {request_id} never started"
        time.sleep(0.1)


# hosts ------------------------------------------------------------------------------------------
def test_every_host_serves_its_devices_and_models(cluster, ray_client):
    capacity = ray_client.get_capacity()
    assert (
        capacity["executor"]["name"] == "ray" and capacity["executor"]["ray_address"] == cluster.ray_address
    )
    hosts = {host["host"]: host for host in capacity["hosts"]}
    assert sorted(hosts) == ["a", "b", "c"]
    assert [device["id"] for device in capacity["devices"]] == ["a/cpu", "b/cpu", "c/cpu"]
    assert hosts["a"]["models"] == hosts["b"]["models"] == ["tiny"] and hosts["c"]["models"] == [
        "small-gpt2",
        "tiny",
    ]
    assert capacity["slots_total"] == sum(host["slots_total"] for host in hosts.values()) == 3
    # small-gpt2's weights are only on host c; the head tokenizes with the files c registered.
    assert ray_client.tokenize("small-gpt2", ["the quick brown fox"])[0]
    listing = subprocess.run(
        [sys.executable, "-m", "cortex_nb.cli", "host", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "CORTEX_URL": cluster.backend.url, "CORTEX_TOKEN": cluster.backend.token},
    )
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:-1]}
    assert sorted(rows) == ["a", "b", "c"] and "small-gpt2, tiny" in rows["c"] and rows["b"].endswith("1/1")
    assert listing.stdout.splitlines()[-1].startswith("3 host(s), 3/3 slots free")


# the core paths, trainer and sampler on different hosts -----------------------------------------
def test_trainer_and_sampler_run_on_different_hosts(ray_client, pair):
    job, _ = pair
    subs = {sub["sub_job_id"]: sub for sub in ray_client.get_job(job.job_id)["sub_jobs"]}
    trainer, sampler = subs["training-0"], subs["sampling-0"]
    assert trainer["info"]["host"] != sampler["info"]["host"]
    assert trainer["info"]["node_id"] != sampler["info"]["node_id"]
    assert trainer["device"] == f"{trainer['info']['host']}/cpu"


def test_training_and_greedy_generate_match_in_process_peft(pair):
    job, reference = pair
    rng = np.random.default_rng(11)
    for step in range(3):
        batch = random_batch(rng, TINY_VOCAB, batch=3, length=24)
        remote, remote_step = job.forward_backward(batch), job.step()
        expected, expected_logprobs = reference.train_step(batch)
        assert remote.result()["loss"] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE), (
            f"step {step}"
        )
        np.testing.assert_allclose(
            remote.result()["tensors"]["logprobs"], expected_logprobs, rtol=0, atol=TOLERANCE
        )
        assert remote_step.result()["step"] == step + 1
    reference.model.eval()
    probe = random_batch(rng, TINY_VOCAB, batch=2, length=16, pad_tail=False)
    with torch.no_grad():
        expected_logprobs = reference_logprobs(reference.model, probe).numpy()
    np.testing.assert_allclose(
        job.forward(probe).result()["tensors"]["logprobs"], expected_logprobs, rtol=0, atol=TOLERANCE
    )
    prompts = [rng.integers(0, TINY_VOCAB, size=n).tolist() for n in (3, 9)]
    result = job.generate(prompts, sub_job="training-0", max_tokens=16, temperature=0.0).result()
    for prompt, sample in zip(prompts, result.samples, strict=True):
        assert sample["tokens"] == hf_greedy(reference.model, prompt, 16)[: len(sample["tokens"])]
    assert result.weight_version == 3


def test_weight_sync_moves_the_trainers_weights_to_the_other_host(pair):
    job, _ = pair
    train(job, [text_batch()] * 6)
    trained = job.generate(
        ["the sampler"], sub_job="training-0", max_tokens=24, temperature=0.0, ignore_eos=True
    ).result()
    before = job.generate(
        ["the sampler"], sub_job="sampling-0", max_tokens=24, temperature=0.0, ignore_eos=True
    ).result()
    assert before.tokens != trained.tokens, (
        "training must change the greedy output, or equality proves nothing"
    )

    synced = job.sync_sampler().result()
    assert synced["path"] == "delta" and synced["weight_version"] == trained.weight_version
    target = synced["targets"][0]
    assert target["sub_job_id"] == "sampling-0" and target["fallback_reason"] is None
    assert (
        0 < target["bytes"] < target["raw_bytes"]
        and synced["bytes"] == synced["relayed_bytes"] == target["bytes"]
    )
    after = job.generate(
        ["the sampler"], sub_job="sampling-0", max_tokens=24, temperature=0.0, ignore_eos=True
    ).result()
    assert after.tokens == trained.tokens and after.weight_version == trained.weight_version
    # A full transfer lands bit for bit: the target's state hash is the trainer's.
    exact = job.sync_sampler(weight_format="full").result()
    assert exact["path"] == "full" and exact["targets"][0]["result_hash"] == exact["source_hash"]


def test_checkpoints_are_kept_in_the_heads_data_dir_and_load_on_another_host(cluster, pair, tmp_path):
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    job, reference = pair
    saved = job.save("on-head").result()
    assert saved["checkpoint_id"] == "on-head" and saved["size_bytes"] > 0
    kept = [path for path in cluster.backend.data_dir.rglob("on-head") if path.is_dir()]
    assert len(kept) == 1 and {"manifest.json", "optimizer.safetensors"} <= {
        p.name for p in kept[0].iterdir()
    }
    # The export (read on the head) is the trainer's adapter; the weight-sync test trained 6 more steps,
    # so compare with the served logprobs rather than the reference's stale copy.
    exported = load_file(str(job.export(tmp_path / "adapter", "on-head") / "adapter_model.safetensors"))
    assert sorted(exported) == sorted(get_peft_model_state_dict(reference.model))
    probe = random_batch(np.random.default_rng(5), TINY_VOCAB, batch=2, length=12, pad_tail=False)
    trainer_view = job.forward(probe, sub_job="training-0").result()["tensors"]["logprobs"]
    job.sync_sampler(weight_format="full").result()
    train(job, [text_batch()] * 2)  # the sampler keeps the saved weights; the trainer moves on
    loaded = job.load("on-head", target_sub_job_id="sampling-0").result()
    assert loaded["checkpoint_id"] == "on-head"
    # The sampler merges the loaded adapter into its own weights: equal up to fp32 rounding.
    np.testing.assert_allclose(
        job.forward(probe, sub_job="sampling-0").result()["tensors"]["logprobs"],
        trainer_view,
        rtol=0,
        atol=1e-4,
    )
    assert not np.array_equal(
        job.forward(probe, sub_job="training-0").result()["tensors"]["logprobs"], trainer_view
    )


def test_logs_of_both_hosts_arrive_once_in_order(ray_client, pair):
    job, _ = pair

    def lines_and_steps():
        lines = ray_client.tail_logs(job.job_id, limit=5000)["lines"]
        return lines, sum(line["line"].startswith("[engine] step=") for line in lines)

    _, steps_before = lines_and_steps()
    train(job, [text_batch()] * 2)
    # An actor's output reaches the head through its captured fds, not with the result: wait for the lines.
    deadline = time.monotonic() + 60
    lines, steps = lines_and_steps()
    while steps < steps_before + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        lines, steps = lines_and_steps()
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(set(seqs))
    by_sub = {
        sub: [line["line"] for line in lines if line["sub_job_id"] == sub]
        for sub in ("training-0", "sampling-0")
    }
    assert any(line.startswith("[engine] sampling-0 ready") for line in by_sub["sampling-0"])
    engine = [
        line.split()[1].split("=")
        for line in by_sub["training-0"]
        if line.startswith(("[engine] forward_backward=", "[engine] step="))
    ][-4:]
    fb, step = int(engine[0][1]), int(engine[1][1])
    assert engine == [
        ["forward_backward", str(fb)],
        ["step", str(step)],
        ["forward_backward", str(fb + 1)],
        ["step", str(step + 1)],
    ]
    assert not any("FutureWarning" in line for line in by_sub["training-0"])


def test_device_metrics_are_read_on_each_host_and_tagged_with_it(ray_client, pair):
    job, _ = pair
    hosts = host_of(ray_client, job.job_id)
    deadline = time.monotonic() + 60
    while True:
        samples = ray_client.get_job_metrics(job.job_id, limit=5000)["samples"]
        seen = {sample["device"] for sample in samples}
        if seen >= {f"{host}/cpu" for host in hosts.values()} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen == {f"{host}/cpu" for host in hosts.values()}
    for sample in samples:
        assert sample["host"] == sample["device"].split("/")[0]
        assert HOST_FIELDS <= set(sample) and not any(key.startswith("gpu_") for key in sample)
        assert set(sample["sub_job_ids"]) <= {"training-0", "sampling-0"}


def test_a_request_cancelled_mid_generate_stops_and_the_sampler_serves_on(ray_client, pair):
    job, _ = pair
    long = job.generate(["x"] * 2, sub_job="sampling-0", **LONG_GENERATE)
    wait_until_started(ray_client, job.job_id, long.request_id)
    ray_client.cancel_request(job.job_id, long.request_id)
    with pytest.raises(RequestFailed) as cancelled:
        long.result()
    assert cancelled.value.code == "cancelled"
    assert len(job.generate(["abc"], sub_job="sampling-0", max_tokens=4).result().tokens[0]) == 4


# failures ---------------------------------------------------------------------------------------
def test_a_killed_actor_fails_only_its_job_with_worker_crashed(ray_client, pair):
    job, _ = pair
    victim = ray_client.create_training_job("tiny", wait=False)  # the one free slot: host c
    victim.wait_ready(timeout_s=600)
    assert host_of(ray_client, victim.job_id) == {"training-0": "c"}
    running = victim.generate(["x"] * 2, **LONG_GENERATE)
    wait_until_started(ray_client, victim.job_id, running.request_id)
    os.kill(ray_client.get_job(victim.job_id)["sub_jobs"][0]["info"]["pid"], 9)
    failed = wait_for_status(ray_client, victim.job_id, ("failed",))
    assert failed["failure_code"] == "worker_crashed" and "on host c" in failed["failure_message"]
    with pytest.raises(RequestFailed):
        running.result()
    # The other job, on the other hosts, carries on; host c is free again.
    assert job.forward(random_batch(np.random.default_rng(1), TINY_VOCAB, 1, 8)).result()["tensors"][
        "logprobs"
    ].shape == (1, 8)
    deadline = time.monotonic() + 30
    while {h["host"]: h for h in ray_client.get_capacity()["hosts"]}["c"]["slots_available"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_lost_host_fails_its_jobs_and_the_queue_carries_on(cluster, ray_client, pair):
    job, _ = pair
    on_c = ray_client.create_training_job("tiny", wait=False)  # a and b are the pair's: host c
    on_c.wait_ready(timeout_s=600)
    assert host_of(ray_client, on_c.job_id) == {"training-0": "c"}
    running = on_c.generate(["x"] * 2, **LONG_GENERATE)
    wait_until_started(ray_client, on_c.job_id, running.request_id)
    waits_for_c = ray_client.create_training_job(
        "small-gpt2", wait=False
    )  # only host c has the model; it is busy
    # A training run queued behind it: when it runs, its loop writes checkpoints on its host.
    managed = ray_client.train({**MANAGED_SPEC, "data": addition_problems()[:64]}, name="managed-on-ray")
    assert "on a host with small-gpt2" in ray_client.get_job(waits_for_c.job_id)["queue"]["reason"]

    cluster.hosts["c"].raylet().kill()
    lost = wait_for_status(ray_client, on_c.job_id, ("failed",))
    assert lost["failure_code"] == "host_lost" and "host c left the cluster" in lost["failure_message"]
    with pytest.raises(RequestFailed):
        running.result()
    never = wait_for_status(ray_client, waits_for_c.job_id, ("failed",))
    assert never["failure_code"] == "no_host_for_model" and "small-gpt2" in never["failure_message"]
    queued = ray_client.get_job(managed.job_id)
    assert queued["status"] == JOB_PENDING and queued["queue"]["reason"].startswith("waiting for a cpu slot")
    capacity = ray_client.get_capacity()
    assert [host["host"] for host in capacity["hosts"]] == ["a", "b"] and capacity["pending"] == 1
    with pytest.raises(ConflictError) as refused:
        ray_client.create_training_job("small-gpt2", wait=False)
    assert refused.value.code == "no_host_for_model" and "cortex-nb host join" in str(refused.value)

    # The backend and the other jobs carry on: the pair answers, and when it ends the queued run trains on a
    # remaining host, its checkpoints kept in the head's data dir.
    assert job.generate(["abc"], sub_job="sampling-0", max_tokens=3).result().tokens
    job.cancel()
    finished = managed.wait(timeout_s=600)
    assert finished["status"] == "done" and finished["sub_jobs"][0]["device"] in ("a/cpu", "b/cpu")
    assert (
        finished["progress"]["step"] == MANAGED_SPEC["steps"]
        and finished["progress"]["last_checkpoint"] == "final"
    )
    kept = {checkpoint["checkpoint_id"] for checkpoint in ray_client.list_checkpoints(managed.job_id)}
    assert kept == {"step-2", "final"}
    assert {path.name for path in cluster.backend.data_dir.rglob("step-2") if path.is_dir()} == {"step-2"}


def test_host_join_refuses_a_host_whose_versions_differ(cluster, tmp_path):
    repository = Path(__file__).resolve().parent.parent
    other = tmp_path / "other-cortex-nb"
    shutil.copytree(
        repository / "cortex_nb",
        other / "cortex_nb",
        ignore=shutil.ignore_patterns("labextension", "__pycache__"),
    )
    shutil.copytree(
        repository / "backend" / "cortex_backend",
        other / "cortex_backend",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    version_file = other / "cortex_nb" / "protocol" / "versions.py"
    version_file.write_text(
        version_file.read_text().replace('__version__ = "', '__version__ = "9.9.9+other-')
    )
    before = cluster.host_names()
    # From a directory of its own, so the copy (not this checkout) is what `python -m` imports; in a
    # process group of its own with --block, so a join that wrongly went ahead is stopped whole.
    joining = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cortex_nb.cli",
            "host",
            "join",
            cluster.ray_address,
            "--name",
            "d",
            "--devices",
            "cpu:1",
            "--token-file",
            str(cluster.token_file),
            "--block",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(other)},
    )
    try:
        stdout, stderr = joining.communicate(timeout=120)
    finally:
        if joining.poll() is None:
            os.killpg(joining.pid, signal.SIGKILL)
            joining.wait()
    assert joining.returncode == 2, stdout + stderr
    assert (
        "versions differ from the head's" in stderr
        and "cortex-nb: head 0.1.0, this host 9.9.9+other-0.1.0" in stderr
    )
    assert "$ " not in stdout  # refused before Ray started anything here (the command is not even shown)
    assert cluster.host_names() == before
