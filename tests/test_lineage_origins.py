"""A job's lineage backwards (`origins`), against the real backend: a job that loaded a checkpoint of a copy of
an exported checkpoint shows the load, the copy and the job that trained the exported adapter, nearest first;
the copy's origin survives its labels being replaced; another owner's token sees none of it."""

from __future__ import annotations

import json

import httpx
import pytest

from cortex_nb import Client
from cortex_nb.demo_data import addition_problems
from cortex_nb.views import lineage_frame

from .tokens import create_token
from .training_data import random_batches, train

TINY_VOCAB = 259


@pytest.fixture(scope="module")
def owner(backend):
    token = create_token(backend.data_dir, "origins-owner", "jobs:read", "jobs:write")
    with Client(backend.url, token) as client:
        yield client


def test_lineage_follows_loads_and_copies_back_to_the_job_that_trained_an_exported_adapter(
    backend, owner, tmp_path
):
    batches = random_batches(2, TINY_VOCAB, seed=3)
    first = owner.create_training_job("tiny", name="origins-first", lora={"r": 4}, seed=1)
    train(first, batches[:1])
    first.save("trained", "weights-only").result()
    exported = owner.export_checkpoint(first.job_id, "trained", tmp_path / "exported")
    manifest = json.loads((exported / "manifest.json").read_text())
    first.complete(wait=True)
    # The exported adapter's checkpoint, copied into a job of its own, whose labels are then replaced.
    copy_job = owner.copy_checkpoint(first.job_id, "trained")["job_id"]
    owner.api.update_job(copy_job, labels={"team": "eval"})
    # A second job starts from the copy, trains on, saves; a sampler loads that.
    second = owner.create_training_job("tiny", name="origins-second", lora={"r": 4}, seed=2)
    second.load("trained", source_job_id=copy_job).result()
    train(second, batches[1:])
    second.save("tuned", "weights-only").result()
    sampler = owner.create_sampler("tiny", lora={"r": 4})
    try:
        sampler.load("tuned", source_job_id=second.job_id).result()
        lineage = owner.api.job_lineage(sampler.job_id)
    finally:
        sampler.complete()
        second.cancel()
    chain = [
        (o["via"], o["job_id"], o["source_job_id"], o["checkpoint_id"], o["step"]) for o in lineage["origins"]
    ]
    assert chain == [
        ("load", sampler.job_id, second.job_id, "tuned", 2),
        ("load", second.job_id, copy_job, "trained", 1),
        ("copy", copy_job, first.job_id, "trained", 1),
    ]
    # The chain ends at the job and checkpoint the exported adapter's manifest names, which was exported.
    root = lineage["origins"][-1]
    assert (root["source_job_id"], root["checkpoint_id"]) == (manifest["job_id"], manifest["checkpoint_id"])
    assert root["source_name"] == "origins-first" and root["checkpoint_exists"] is True
    assert [export["contents"] for export in root["exports"]] == ["adapter"]
    assert root["request_id"] is None and lineage["origins"][0]["request_id"] is not None
    assert lineage["origins"][0]["sub_job_id"] == "sampling-0"
    assert lineage_frame(lineage).attrs["origins"] == (
        f"{second.job_id}/tuned (load) ← {copy_job}/trained (load) ← {first.job_id}/trained (copy)"
    )
    # A job that started from nothing has no origins; the source job's own lineage still lists the load.
    assert owner.api.job_lineage(first.job_id)["origins"] == []
    uses = {row["checkpoint_id"]: row["uses"] for row in owner.api.job_lineage(second.job_id)["checkpoints"]}
    assert [use["job_id"] for use in uses["tuned"]] == [sampler.job_id]
    stranger = create_token(backend.data_dir, "origins-stranger", "jobs:read")
    refused = httpx.get(
        f"{backend.url}/v1/jobs/{sampler.job_id}/lineage", headers={"Authorization": f"Bearer {stranger}"}
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "job_not_found"


def test_a_deleted_source_checkpoint_stays_in_the_chain_without_a_step(owner):
    source = owner.create_training_job("tiny", name="origins-gone", lora={"r": 4}, seed=4)
    train(source, random_batches(1, TINY_VOCAB, seed=4))
    source.save("once", "weights-only").result()
    taker = owner.create_sampler("tiny", lora={"r": 4})
    try:
        taker.load("once", source_job_id=source.job_id).result()
    finally:
        taker.complete(wait=True)  # a job that has not ended holds what it loaded against deletion
    owner.api.delete_checkpoint(source.job_id, "once")
    (origin,) = owner.api.job_lineage(taker.job_id)["origins"]
    assert (origin["source_job_id"], origin["checkpoint_id"]) == (source.job_id, "once")
    assert origin["step"] is None and origin["checkpoint_exists"] is False
    source.cancel()


def test_a_run_started_from_a_checkpoint_names_it_and_what_that_job_loaded(owner):
    """A managed run's `init_from` is an origin; the source job's own load follows it."""
    rows = addition_problems()
    spec = {
        "base_model": "tiny",
        "batch_size": 8,
        "max_seq_len": 16,
        "lora": {"r": 8, "alpha": 16},
        "seed": 3,
    }
    root = owner.train({**spec, "data": rows, "steps": 1, "save": {"every": 1}}, name="origins-root")
    root.wait(timeout_s=300)
    saved = owner.list_checkpoints(root.job_id)[-1]["checkpoint_id"]
    middle = owner.create_training_job("tiny", lora=spec["lora"], seed=3)
    middle.load(saved, source_job_id=root.job_id).result()
    middle.save("picked").result()
    middle.cancel()
    run = owner.train(
        {**spec, "data": rows, "steps": 1, "init_from": {"job": middle.job_id, "checkpoint": "picked"}},
        name="origins-run",
    )
    assert run.wait(timeout_s=300)["status"] == "done"
    chain = [
        (o["via"], o["job_id"], o["source_job_id"], o["checkpoint_id"])
        for o in owner.api.job_lineage(run.job_id)["origins"]
    ]
    assert chain == [
        ("init_from", run.job_id, middle.job_id, "picked"),
        ("load", middle.job_id, root.job_id, saved),
    ]
