"""Training runs on the real backend: the loop in the training worker, datasets named by their
hash, the progress record every view reads, and jobs that free their device when their work ends."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from cortex_nb import BadRequestError, Client, NotFoundError
from cortex_nb.batching import rows_to_batch
from cortex_nb.demo_data import addition_problems
from cortex_nb.train_data import Example, examples_to_jsonl, tokenize_and_pack

from .notebook_fixtures import wait_until
from .tokens import create_token

SPEC = {
    "base_model": "tiny",
    "steps": 12,
    "batch_size": 8,
    "max_seq_len": 16,
    "optimizer": {"lr": 0.003},
    "lora": {"r": 8, "alpha": 16},
    "seed": 3,
}


def test_a_managed_run_trains_to_the_same_losses_as_the_primitive_api(client: Client):
    """The worker's loop cuts rows and batches with the kernel's own code and steps the same trainer:
    the same spec driven through forward_backward/step (same seed, CPU fp32) gives the same curve."""
    rows = addition_problems()
    managed = client.train({**SPEC, "data": rows}, name="parity-managed")
    primitive = client.create_training_job(
        "tiny", lora=SPEC["lora"], optimizer=SPEC["optimizer"], seed=SPEC["seed"], name="parity-primitive"
    )
    data = tokenize_and_pack(
        client, "tiny", [Example(r["prompt"], r["completion"]) for r in rows], SPEC["max_seq_len"]
    )
    batches = data.batches(SPEC["batch_size"], SPEC["seed"])
    losses = []
    for _ in range(SPEC["steps"]):
        batch = rows_to_batch(next(batches), data.pad_id)
        fb, step = primitive.forward_backward(batch), primitive.step()
        losses.append(fb.result()["loss"] / float(batch["weights"].sum()))
        step.result()
    finished = managed.wait(timeout_s=300)
    assert finished["status"] == "done" and finished["progress"]["phase"] == "finished"
    managed_curve = [point["loss_per_token"] for point in finished["progress"]["history"]]
    assert managed_curve == pytest.approx(losses, rel=1e-6, abs=1e-7)
    assert losses[-1] < losses[0] / 2
    # The primitive job's own record is folded from its results: the same numbers, by the same rule.
    record = primitive.refresh()["progress"]
    assert record["source"] == "primitive" and record["step"] == 12 and record["total_steps"] is None
    assert [p["loss_per_token"] for p in record["history"]] == pytest.approx(
        managed_curve, rel=1e-6, abs=1e-7
    )
    assert record["tokens"] == finished["progress"]["tokens"] > 0
    assert (
        finished["progress"]["last_checkpoint"] == "final"
        and finished["progress"]["last_checkpoint_step"] == 12
    )

    # Free device on the client's own job: its 12 trained steps are in no checkpoint, so they are saved first.
    freed = primitive.complete()
    assert freed["saved_checkpoint"] == "final"
    wait_until(lambda: primitive.refresh()["status"] == "done", 60)
    [final] = client.list_checkpoints(primitive.job_id)
    assert final["checkpoint_id"] == "final" and final["step"] == 12 and final["type"] == "weights-only"
    assert (
        primitive.info["progress"]["phase"] == "finished"
        and primitive.info["progress"]["last_checkpoint"] == "final"
    )
    again = primitive.complete()  # idempotent once done, and nothing more to save
    assert again["status"] == "done" and again["saved_checkpoint"] is None


def test_a_dataset_is_uploaded_once_and_named_by_its_hash(client: Client, backend):
    body = examples_to_jsonl([Example(None, "the lamp is lit"), Example("2+2=", "4")])
    dataset_id = hashlib.sha256(body).hexdigest()
    first = client.upload_dataset(body)
    assert first == dataset_id and client.get_dataset(dataset_id)["rows"] == 2
    headers = {"Authorization": f"Bearer {backend.token}"}
    with httpx.Client(base_url=backend.url, headers=headers) as http:
        wrong = http.put(f"/v1/datasets/{'0' * 64}", content=body)
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "hash_mismatch"
        bad = b'{"text": "fine"}\n{"txt": "typo"}\n'
        refused = http.put(f"/v1/datasets/{hashlib.sha256(bad).hexdigest()}", content=bad)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_dataset"
        assert "line 2" in refused.json()["error"]["message"]
    # Another owner's dataset is not there for them (a 404, like another owner's job).
    other = Client(backend.url, create_token(backend.data_dir, "other-owner", "jobs:read", "jobs:write"))
    with pytest.raises(NotFoundError) as missing:
        other.get_dataset(dataset_id)
    assert missing.value.code == "dataset_not_found"
    with pytest.raises(NotFoundError) as refused_job:
        other._call(
            "create_job",
            json={
                "sub_jobs": [{"type": "training", "base_model": "tiny"}],
                "training_loop": {"data": {"dataset_id": dataset_id}, "steps": 2},
            },
        )
    assert refused_job.value.code == "dataset_not_found"


@pytest.mark.parametrize(
    ("loop", "field"),
    [
        ({"data": {"dataset_id": "a" * 64}, "steps": 2, "stepz": 3}, "training_loop.stepz"),
        ({"data": {"dataset_id": "nothex"}, "steps": 2}, "training_loop.data.dataset_id"),
        ({"data": {"dataset_id": "a" * 64}, "steps": 0}, "training_loop.steps"),
        ({"data": {"dataset_id": "a" * 64}, "steps": 2, "keep_alive_s": -1}, "training_loop.keep_alive_s"),
        (
            {"data": {"dataset_id": "a" * 64}, "steps": 2, "sample": {"every": 1, "prompts": ["x" * 3000]}},
            "training_loop.sample.prompts[0]",
        ),
    ],
)
def test_a_bad_training_loop_is_refused_naming_the_field(client: Client, loop, field):
    body = examples_to_jsonl([Example(None, "text")])
    if loop["data"]["dataset_id"] == "a" * 64:
        loop = {**loop, "data": {"dataset_id": client.upload_dataset(body)}}
    with pytest.raises(BadRequestError) as refused:
        client._call(
            "create_job",
            json={"sub_jobs": [{"type": "training", "base_model": "tiny"}], "training_loop": loop},
        )
    assert refused.value.status == 400 and refused.value.detail["field"] == field, refused.value


def test_a_long_run_answers_long_polls_serves_requests_between_steps_and_frees_its_device_keeping_the_adapter(
    client: Client,
):
    job = client.train({**SPEC, "data": addition_problems(), "steps": 2000})
    wait_until(lambda: (job.progress or {}).get("step", 0) >= 2, 120)
    before = job.info["progress"]
    # Waiting for news past the current record answers with a newer one, well before the 20 s limit.
    answered = client.wait_for_progress(job.job_id, before["updated_at"], 20.0)
    assert answered["progress"]["updated_at"] > before["updated_at"]
    assert answered["progress"]["step"] >= before["step"]
    assert client.wait_for_progress(job.job_id, 0.0, 20.0)["progress"]["step"] >= 2  # newer already: at once
    # A sample asked for while the loop trains runs between two steps, not after the whole run.
    sample = job.generate(["2+3="], max_tokens=2, temperature=0).result(timeout_s=120)
    assert 2 <= sample.weight_version < 2000 and job.refresh()["progress"]["phase"] == "training"
    # Free device mid-training: the loop stops after its step in hand and saves the adapter as `final`.
    assert job.complete()["saved_checkpoint"] == "final"
    ended = client.wait_for_progress(job.job_id, answered["progress"]["updated_at"], 20.0)
    wait_until(lambda: job.refresh()["status"] == "done", 60)
    progress = job.info["progress"]
    assert progress["phase"] == "stopped" and 2 <= progress["step"] < 2000
    checkpoints = {c["checkpoint_id"]: c for c in client.list_checkpoints(job.job_id)}
    assert checkpoints["final"]["step"] == progress["step"] == progress["weight_version"]
    assert ended["progress"]["updated_at"] > answered["progress"]["updated_at"]


def test_keep_alive_holds_the_device_for_sampling_then_frees_it(client: Client):
    job = client.train({**SPEC, "data": addition_problems(), "steps": 3, "keep_alive": "3s"})
    kept = job.wait(timeout_s=300)
    assert kept["status"] == "running" and kept["progress"]["phase"] == "keep_alive"
    assert kept["keep_alive_until"] is not None and kept["idle"] is None
    sampled = job.generate(["2+3="], max_tokens=2, temperature=0).result()  # the device is still there
    assert sampled.weight_version == 3
    wait_until(lambda: job.refresh()["status"] == "done", 60)
    assert job.info["progress"]["phase"] == "finished" and job.info["keep_alive_until"] is None


def test_an_idle_primitive_job_says_when_it_frees_its_device(client: Client):
    job = client.create_training_job("tiny", idle_timeout_s=2.0, name="idle-soon")
    info = job.refresh()
    assert info["idle"]["timeout_s"] == 2.0 and info["idle"]["frees_at"] == pytest.approx(
        info["last_activity_at"] + 2.0
    )
    wait_until(lambda: job.refresh()["status"] == "done", 60)
    assert job.info["idle"] is None and not client.list_checkpoints(
        job.job_id
    )  # nothing trained, nothing saved


def test_a_list_of_jobs_carries_every_views_fields(client: Client, backend):
    rows = client.list_jobs(limit=5)
    assert rows and all(
        {"progress", "queue", "idle", "keep_alive_until", "training_loop"} <= set(row) for row in rows
    )
    with httpx.Client(base_url=backend.url, headers={"Authorization": f"Bearer {backend.token}"}) as http:
        capacity = http.get("/v1/capacity").json()
    assert capacity["pending_jobs"] == [] and capacity["slots_total"] == 8
    # A progress record is plain JSON a browser can read as is.
    json.dumps(rows)
