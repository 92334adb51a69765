"""Checkpoints against the real backend: exact resume, PEFT-loadable export, ownership, deletion,
crash safety and quotas."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cortex_nb import BadRequestError, Client, ConflictError, CortexError, NotFoundError, RequestFailed
from cortex_nb.checkpoint_files import extract_verified
from cortex_nb.protocol.state_hash import state_hash

from .backend_process import start_backend
from .training_data import random_batches, train

TINY_VOCAB = 259


def checkpoint_dirs(data_dir: Path, pattern: str = "*") -> list[Path]:
    return sorted((data_dir / "checkpoints").glob(f"*/*/{pattern}"))


def load_export(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: load_file(str(path / name))
        for name in ("adapter_model.safetensors", "optimizer.safetensors", "rng_state.safetensors")
        if (path / name).exists()
    }


def test_resume_is_bitwise_exact(client, tmp_path):
    """10 steps, save, load into a new job, 10 more == 20 steps straight (adapter AND optimizer state)."""
    spec = {
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1},
        "optimizer": {"lr": 5e-3, "weight_decay": 0.01},
        "seed": 3,
    }
    batches = random_batches(20, TINY_VOCAB, seed=7)
    first = client.create_training_job("tiny", wait=False, **spec)
    straight = client.create_training_job("tiny", wait=False, **spec)
    first.wait_ready()
    straight.wait_ready()
    with first, straight:
        train(first, batches[:10])
        saved = first.save("after-10").result()
        assert saved["checkpoint"]["type"] == "resumable" and saved["step"] == 10
        straight_losses = train(straight, batches)
        straight.save("after-20").result()

        with client.create_training_job("tiny", **spec) as resumed:
            loaded = resumed.load("after-10", source_job_id=first.job_id).result()
            assert loaded == {**loaded, "step": 10, "weight_version": 10, "restored_optimizer": True}
            resumed_losses = train(resumed, batches[10:])
            assert resumed.save("after-20").result()["step"] == 20

        with client.create_training_job("tiny", **spec) as fresh_moments:
            fresh_moments.load("after-10", source_job_id=first.job_id, restore_optimizer=False).result()
            train(fresh_moments, batches[10:])
            fresh_moments.save("after-20").result()

    assert resumed_losses == straight_losses[10:]
    exported = {}
    for name, job in (("straight", straight), ("resumed", resumed), ("fresh_moments", fresh_moments)):
        exported[name] = load_export(
            client.export_checkpoint(job.job_id, "after-20", tmp_path / name, contents="all")
        )
    for part in ("adapter_model.safetensors", "optimizer.safetensors", "rng_state.safetensors"):
        expected, actual = exported["straight"][part], exported["resumed"][part]
        assert sorted(expected) == sorted(actual)
        for tensor in expected:
            assert torch.equal(expected[tensor], actual[tensor]), f"{part}: {tensor} differs"
    assert any(key.endswith("::exp_avg_sq") for key in exported["resumed"]["optimizer.safetensors"])
    steps = [t for k, t in exported["resumed"]["optimizer.safetensors"].items() if k.endswith("::step")]
    assert steps and all(float(t) == 20.0 for t in steps)
    assert json.loads((tmp_path / "resumed" / "trainer_state.json").read_text())["step"] == 20
    # The control: without the optimizer's moments the run goes elsewhere, so the equality above means something.
    adapter = exported["straight"]["adapter_model.safetensors"]
    assert not all(
        torch.equal(adapter[t], exported["fresh_moments"]["adapter_model.safetensors"][t]) for t in adapter
    )


def test_exported_adapter_loads_with_peft_and_matches_the_backend(client, gpt2_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    vocab = next(m["vocab_size"] for m in client.list_models() if m["name"] == "small-gpt2")
    probe = random_batches(1, vocab, rows=3, length=20, seed=11)[0]
    with client.create_training_job("small-gpt2", optimizer={"lr": 1e-2}, seed=5) as job:
        train(job, random_batches(3, vocab, seed=12))
        exported = job.export(tmp_path / "adapter")
        served = job.forward(
            {"input_ids": probe["input_ids"], "target_tokens": probe["target_tokens"]}
        ).result()
    assert sorted(p.name for p in exported.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
    ]
    config = json.loads((exported / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "small-gpt2" and config["peft_type"] == "LORA"

    base = AutoModelForCausalLM.from_pretrained(str(gpt2_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(exported)).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(probe["input_ids"])).logits
        with model.disable_adapter():
            base_logits = model(input_ids=torch.from_numpy(probe["input_ids"])).logits
    targets = torch.from_numpy(probe["target_tokens"])[..., None]
    ours = torch.log_softmax(logits.float(), -1).gather(-1, targets)[..., 0].numpy()
    untrained = torch.log_softmax(base_logits.float(), -1).gather(-1, targets)[..., 0].numpy()
    backend_logprobs = served["tensors"]["logprobs"]
    assert np.abs(ours - backend_logprobs).max() < 1e-5
    assert np.abs(untrained - backend_logprobs).max() > 1e-3, (
        "the adapter must matter for the comparison to mean anything"
    )
    manifest = json.loads((exported / "manifest.json").read_text())
    weights = load_file(str(exported / "adapter_model.safetensors"))
    assert manifest["state_hash"] == state_hash({name: t.numpy() for name, t in weights.items()})


def _token_for(backend, owner: str) -> str:
    created = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "token",
            "create",
            "--name",
            owner,
            "--scopes",
            "jobs:read",
            "jobs:write",
            "--data-dir",
            str(backend.data_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return created.stdout.strip().splitlines()[0]


def test_checkpoints_outlive_their_job_and_stay_with_their_owner(client, backend, tmp_path):
    with client.create_training_job("tiny", seed=1) as job:
        train(job, random_batches(2, TINY_VOCAB, seed=3))
        first = job.save("keep", "weights-only").result()
        auto = job.save(checkpoint_type="weights-only").result()
        again = job.save(checkpoint_type="weights-only").result()
    assert (auto["checkpoint_id"], again["checkpoint_id"]) == ("step-2", "step-2-2")
    assert client.wait_for_job(job.job_id, ("done",))["status"] == "done"

    table = job.checkpoints()
    assert list(table.columns[:6]) == [
        "checkpoint_id",
        "type",
        "step",
        "created_at",
        "size_bytes",
        "sub_job_id",
    ]
    assert table["checkpoint_id"].tolist() == ["keep", "step-2", "step-2-2"]
    assert table["step"].tolist() == [2, 2, 2] and (table["size_bytes"] > 500_000).all()
    assert set(table["state_hash"]) == {first["checkpoint"]["state_hash"]}
    assert client.export_checkpoint(job.job_id, "keep", tmp_path / "kept").is_dir()

    with client.create_sampler("tiny") as sampler:
        assert sampler.load("keep", source_job_id=job.job_id).result()["weight_version"] == 2
        assert sampler.generate(["hi"], max_tokens=4, temperature=0.0).result().weight_version == 2

    with Client(backend.url, _token_for(backend, "someone-else")) as other:
        with pytest.raises(NotFoundError) as hidden:
            other.list_checkpoints(job.job_id)
        assert hidden.value.code == "job_not_found"
        with other.create_sampler("tiny") as theirs:
            with pytest.raises(NotFoundError) as refused:
                theirs.load("keep", source_job_id=job.job_id)
            assert refused.value.code == "checkpoint_not_found"
        with pytest.raises(NotFoundError):
            other.delete_checkpoint(job.job_id, "keep")
    assert len(client.list_checkpoints(job.job_id)) == 3


def test_deleting_a_checkpoint_a_load_is_reading_is_refused(client):
    with client.create_training_job("tiny", samplers=1, seed=2) as job:
        train(job, random_batches(1, TINY_VOCAB, seed=4))
        job.save("busy", "weights-only").result()
        # The load queues behind a long generate, so it is certainly still pending when the delete arrives.
        busy = job.generate(["x"], sub_job="sampling-0", max_tokens=300, temperature=0.0, ignore_eos=True)
        load = job.load("busy", target_sub_job_id="sampling-0")
        with pytest.raises(ConflictError) as refused:
            client.delete_checkpoint(job.job_id, "busy")
        assert refused.value.code == "checkpoint_in_use"
        assert busy.result().weight_version == 0
        assert load.result()["weight_version"] == 1
        assert job.generate(["x"], sub_job="sampling-0", max_tokens=2).result().weight_version == 1
        assert client.delete_checkpoint(job.job_id, "busy")["deleted"] is True
        assert client.list_checkpoints(job.job_id) == []
        with pytest.raises(NotFoundError):
            job.load("busy", target_sub_job_id="sampling-0")


def test_checkpoint_requests_are_validated(client, backend):
    headers = {"Authorization": f"Bearer {backend.token}"}
    with client.create_training_job("tiny", samplers=1, seed=0) as job:
        url = f"{backend.url}/v1/jobs/{job.job_id}"
        for bad in ["../x", "a/b", ".hidden", "", "x" * 65, 5, "..", "a b"]:
            response = httpx.post(f"{url}/save", json={"checkpoint_id": bad}, headers=headers)
            assert (
                response.status_code == 400 and response.json()["error"]["code"] == "invalid_checkpoint_id"
            ), bad
        for raw in ["..%2F..%2Fadmin.token", "%2E%2E", ".tmp-x"]:
            for method, suffix in (("GET", ""), ("GET", "/export"), ("DELETE", "")):
                response = httpx.request(method, f"{url}/checkpoints/{raw}{suffix}", headers=headers)
                assert response.status_code == 400, (method, raw, suffix)
                assert response.json()["error"]["code"] == "invalid_checkpoint_id"
        response = httpx.post(f"{url}/save", json={"type": "everything"}, headers=headers)
        assert response.json()["error"]["code"] == "invalid_field"
        with pytest.raises(BadRequestError) as wrong_sub_job:
            client.save(job.job_id, "x", sub_job="sampling-0")
        assert wrong_sub_job.value.code == "unsupported_operation"
        job.save("twice")
        with pytest.raises(ConflictError) as twice:
            job.save("twice")
        assert twice.value.code == "checkpoint_exists"
        with pytest.raises(NotFoundError) as unknown:
            job.load("never-saved")
        assert unknown.value.code == "checkpoint_not_found"
        with client.create_sampler("tiny", lora={"r": 8}) as narrow:
            with pytest.raises(BadRequestError) as incompatible:
                narrow.load("twice", source_job_id=job.job_id)
            assert incompatible.value.code == "incompatible_adapter"


def test_a_checkpoint_changed_on_disk_is_neither_exported_nor_loaded(client, backend, tmp_path):
    with client.create_training_job("tiny", samplers=1, seed=0) as job:
        job.save("tamper", "weights-only").result()
        (directory,) = checkpoint_dirs(backend.data_dir, "tamper")
        weights = directory / "adapter_model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
        with pytest.raises(ConflictError) as export:
            client.export_checkpoint(job.job_id, "tamper", tmp_path / "out")
        assert export.value.code == "checkpoint_corrupted"
        assert not (tmp_path / "out").exists()
        with pytest.raises(RequestFailed) as load:
            job.load("tamper", target_sub_job_id="sampling-0").result()
        assert load.value.code == "checkpoint_corrupted"
        assert job.generate(["x"], sub_job="sampling-0", max_tokens=2).result().weight_version == 0


def test_the_client_refuses_a_damaged_export(client, backend, tmp_path):
    with client.create_training_job("tiny", seed=0) as job:
        job.save("intact", "weights-only").result()
    response = httpx.get(
        f"{backend.url}/v1/jobs/{job.job_id}/checkpoints/intact/export",
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    announced = response.headers["X-Cortex-Manifest-Sha256"]
    intact = response.content
    assert extract_verified(io.BytesIO(intact), tmp_path / "ok", announced)["checkpoint_id"] == "intact"

    members = list(tarfile.open(fileobj=io.BytesIO(intact)))
    weights = next(m for m in members if m.name == "adapter_model.safetensors")
    damaged = bytearray(intact)
    damaged[weights.offset_data + 100] ^= 0xFF
    with pytest.raises(CortexError) as caught:
        extract_verified(io.BytesIO(bytes(damaged)), tmp_path / "damaged", announced)
    assert caught.value.code == "checkpoint_corrupted"
    assert not (tmp_path / "damaged").exists()
    with pytest.raises(CortexError):
        extract_verified(io.BytesIO(intact), tmp_path / "wrong-manifest", "0" * 64)

    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        for name in ("manifest.json", "../escape"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(CortexError):
        extract_verified(evil, tmp_path / "evil", None)
    assert not (tmp_path / "escape").exists()


# ---- crashes and quotas, each in a backend of its own ----------------------------------------------


def _paused_worker_pid(client: Client, job_id: str, timeout_s: float = 60.0) -> int:
    """The pid the `pause_mid_save` fault prints once half the adapter file is on disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in client.tail_logs(job_id, limit=5000)["lines"]:
            found = re.search(r"save paused mid-write .* worker pid (\d+)", line["line"])
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise AssertionError("the save never paused")


def test_a_save_killed_mid_write_leaves_no_valid_checkpoint(tmp_path):
    data_dir = tmp_path / "backend"
    args = ("--devices", "cpu:4", "--worker-threads", "1", "--warm-workers", "0")
    backend = start_backend(data_dir, *args, "--fault-injection", "pause_mid_save")
    try:
        with Client(backend.url, backend.token) as client:
            # 1. The worker dies while writing.
            job = client.create_training_job("tiny", seed=0)
            train(job, random_batches(1, TINY_VOCAB))
            save = job.save("doomed", "weights-only")
            pid = _paused_worker_pid(client, job.job_id)
            (partial,) = checkpoint_dirs(data_dir, ".tmp-*")
            assert (partial / "adapter_config.json").exists() and (
                partial / "adapter_model.safetensors"
            ).exists()
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(RequestFailed) as failed:
                save.result()
            assert failed.value.code == "worker_crashed"
            assert client.list_checkpoints(job.job_id) == []
            assert checkpoint_dirs(data_dir) == []  # the temporary directory went with the failed save

            # 2. The whole backend dies while a worker writes.
            job = client.create_training_job("tiny", seed=0)
            train(job, random_batches(1, TINY_VOCAB))
            job.save("doomed-too", "weights-only")
            pid = _paused_worker_pid(client, job.job_id)
        backend.kill()
        os.kill(pid, signal.SIGKILL)  # the machine went down: its workers too
        assert len(checkpoint_dirs(data_dir, ".tmp-*")) == 1

        backend = start_backend(data_dir, *args)
        with Client(backend.url, backend.token) as client:
            assert client.get_job(job.job_id)["failure_code"] == "backend_restarted"
            assert client.list_checkpoints(job.job_id) == []
            assert checkpoint_dirs(data_dir) == []  # start-up removed the leftover
            with client.create_training_job("tiny", seed=0) as healthy:
                assert healthy.save("fine", "weights-only").result()["checkpoint_id"] == "fine"
            assert [c["checkpoint_id"] for c in client.list_checkpoints(healthy.job_id)] == ["fine"]
    finally:
        backend.stop()


def test_the_checkpoint_quota_is_a_clear_4xx_and_never_half_writes(tmp_path):
    data_dir = tmp_path / "backend"
    backend = start_backend(
        data_dir,
        "--devices",
        "cpu:2",
        "--worker-threads",
        "1",
        "--warm-workers",
        "0",
        "--checkpoint-quota-bytes",
        "1500000",
    )
    try:
        with Client(backend.url, backend.token) as client, client.create_training_job("tiny", seed=0) as job:
            train(job, random_batches(1, TINY_VOCAB))
            with pytest.raises(BadRequestError) as resumable:
                job.save("full", "resumable")  # adapter + two AdamW moments: ~1.8 MB
            assert resumable.value.code == "quota_exceeded" and resumable.value.status == 413
            assert resumable.value.detail["quota_bytes"] == 1_500_000
            assert "delete checkpoints" in resumable.value.message
            job.save("w1", "weights-only").result()
            job.save("w2", "weights-only").result()
            with pytest.raises(BadRequestError) as third:
                job.save("w3", "weights-only")
            assert third.value.code == "quota_exceeded"
            assert [c["checkpoint_id"] for c in client.list_checkpoints(job.job_id)] == ["w1", "w2"]
            assert sum(c["size_bytes"] for c in client.list_checkpoints(job.job_id)) <= 1_500_000
            assert checkpoint_dirs(data_dir, ".tmp-*") == []
            client.delete_checkpoint(job.job_id, "w1")
            assert job.save("w3", "weights-only").result()["checkpoint_id"] == "w3"
    finally:
        backend.stop()
