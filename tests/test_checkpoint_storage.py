"""Checkpoint storage, lineage and bulk actions, and renaming, tagging and deleting jobs, against the real
backend: bytes match the files on disk, kept checkpoints survive bulk deletes, a refusal says why, and
another owner's token sees none of it (404, as everywhere a job is not visible)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from cortex_nb import Client, errors
from cortex_nb.protocol.states import SHORT_LIVED, format_bytes
from cortex_nb.training import sample_checkpoint

from .notebook_fixtures import run_cell
from .tokens import create_token
from .training_data import random_batches, train

TINY_VOCAB = 259


@pytest.fixture(scope="module")
def owner(backend):
    """A token of its own, so this module's storage totals are only its checkpoints."""
    token = create_token(backend.data_dir, "storage-owner", "jobs:read", "jobs:write")
    with Client(backend.url, token) as client:
        yield client


@pytest.fixture(scope="module")
def stranger(backend):
    token = create_token(backend.data_dir, "storage-stranger", "jobs:read", "jobs:write")
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def trained(owner):
    """A job with three checkpoints at steps 1, 2 and 3 (the last named `final`), and a second job with one."""
    job = owner.create_training_job("tiny", name="storage-run", samplers=1, lora={"r": 4}, seed=1)
    batches = random_batches(3, TINY_VOCAB, seed=5)
    train(job, batches[:1])
    job.save("step-1").result()
    train(job, batches[1:2])
    job.save("step-2", "weights-only").result()
    train(job, batches[2:])
    job.save("final").result()
    other = owner.create_training_job("tiny", name="storage-small", lora={"r": 2}, seed=2)
    train(other, batches[:1])
    other.save("step-1", "weights-only").result()
    other.complete(wait=True)
    yield job, other
    job.cancel()


def files_on_disk(data_dir: Path, job_id: str) -> int:
    return sum(
        p.stat().st_size for p in (data_dir / "checkpoints").glob(f"*/{job_id}/[!.]*/*") if p.is_file()
    )


def test_storage_counts_the_bytes_on_disk_per_job_and_owner(backend, owner, stranger, trained):
    job, other = trained
    view = owner.api.storage()
    (mine,) = view["owners"]
    assert mine["owner"] == "storage-owner"
    by_job = {row["job_id"]: row for row in mine["jobs"]}
    for handle, count in ((job, 3), (other, 1)):
        listed = owner.api.list_checkpoints(handle.job_id)["checkpoints"]
        assert by_job[handle.job_id]["checkpoint_count"] == count == len(listed)
        assert by_job[handle.job_id]["size_bytes"] == sum(c["size_bytes"] for c in listed)
        assert by_job[handle.job_id]["size_bytes"] == files_on_disk(backend.data_dir, handle.job_id)
    assert mine["used_bytes"] == sum(row["size_bytes"] for row in mine["jobs"])
    assert [row["job_id"] for row in mine["jobs"]] == [job.job_id, other.job_id]  # largest first
    assert mine["quota_bytes"] is None or mine["quota_bytes"] > mine["used_bytes"]
    # Another owner sees only its own (nothing), and may not name this one.
    theirs = httpx.get(f"{backend.url}/v1/storage", headers=stranger).json()
    assert theirs["owners"] == [
        {
            "owner": "storage-stranger",
            "used_bytes": 0,
            "quota_bytes": mine["quota_bytes"],
            "checkpoint_count": 0,
            "jobs": [],
        }
    ]
    refused = httpx.get(f"{backend.url}/v1/storage", params={"owner": "storage-owner"}, headers=stranger)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    # An admin names the owner and sees the same.
    with Client(backend.url, backend.token) as admin:
        assert admin.api.storage("storage-owner") == view


def test_listing_filters(owner, trained):
    job, _ = trained

    def ids(**filters):
        return [c["checkpoint_id"] for c in owner.api.list_checkpoints(job.job_id, **filters)["checkpoints"]]

    assert ids() == ["step-1", "step-2", "final"]
    assert ids(type="weights-only") == ["step-2"]
    assert ids(min_step=2) == ["step-2", "final"]
    assert ids(max_step=1) == ["step-1"]
    assert ids(kept=True) == []
    created = {
        c["checkpoint_id"]: c["created_at"] for c in owner.api.list_checkpoints(job.job_id)["checkpoints"]
    }
    assert ids(created_before=created["step-2"]) == ["step-1"]
    assert ids(created_after=created["step-2"]) == ["step-2", "final"]
    with pytest.raises(errors.BadRequestError) as caught:
        owner.api.list_checkpoints(job.job_id, type="everything")
    assert caught.value.detail["field"] == "type"


def test_lineage_follows_each_checkpoint_to_its_loads_samplings_exports_and_syncs(
    owner, stranger, backend, trained, tmp_path
):
    job, _ = trained
    synced = job.sync_sampler().result()
    owner.api.export_checkpoint(job.job_id, "step-1", (tmp_path / "step-1.tar").open("wb"))
    job.generate(["The lamp"], max_tokens=2, adapter={"checkpoint_id": "step-2"}).result()
    sampler = owner.create_sampler("tiny", lora={"r": 4})
    try:
        sampler.load("final", source_job_id=job.job_id).result()
    finally:
        sampler.complete()
    lineage = owner.api.job_lineage(job.job_id)
    assert lineage["job_id"] == job.job_id and lineage["name"] == "storage-run" and lineage["step"] == 3
    rows = {row["checkpoint_id"]: row for row in lineage["checkpoints"]}
    assert [row["checkpoint_id"] for row in lineage["checkpoints"]] == ["step-1", "step-2", "final"]
    assert [rows[c]["step"] for c in rows] == [1, 2, 3]
    assert lineage["size_bytes"] == sum(row["size_bytes"] for row in rows.values())
    assert [e["contents"] for e in rows["step-1"]["exports"]] == ["adapter"]
    assert rows["step-1"]["uses"] == [] and rows["final"]["exports"] == []
    (sampled,) = rows["step-2"]["uses"]
    assert (sampled["op"], sampled["job_id"], sampled["status"]) == ("generate", job.job_id, "succeeded")
    (loaded,) = rows["final"]["uses"]
    assert (loaded["op"], loaded["job_id"], loaded["status"]) == ("load", sampler.job_id, "succeeded")
    (sync,) = lineage["weight_syncs"]
    assert sync["status"] == "succeeded" and sync["targets"] == ["sampling-0"]
    assert sync["result"] == {key: synced[key] for key in ("path", "weight_version", "bytes", "source_hash")}
    assert sync["result"]["weight_version"] == 3
    refused = httpx.get(f"{backend.url}/v1/jobs/{job.job_id}/lineage", headers=stranger)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "job_not_found"


def test_keep_and_prune_all_but_final_with_reasons(backend, owner, stranger, trained):
    job, _ = trained
    kept = owner.api.keep_checkpoint(job.job_id, "step-1")
    assert kept["kept"] is True
    assert [c["checkpoint_id"] for c in owner.api.list_checkpoints(job.job_id, kept=True)["checkpoints"]] == [
        "step-1"
    ]
    # A kept checkpoint refuses a plain delete, and says how to take the mark off.
    with pytest.raises(errors.ConflictError) as caught:
        owner.api.delete_checkpoint(job.job_id, "step-1")
    assert caught.value.code == "checkpoint_kept" and "kept" in str(caught.value)
    # Another owner can neither keep nor prune.
    for method, path, body in (
        ("PATCH", f"/v1/jobs/{job.job_id}/checkpoints/step-2", {"kept": True}),
        ("POST", f"/v1/jobs/{job.job_id}/prune_checkpoints", {}),
    ):
        answer = httpx.request(method, f"{backend.url}{path}", json=body, headers=stranger)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "job_not_found"
    # Newer than an hour: nothing goes.
    newer = owner.api.prune_checkpoints(job.job_id, older_than_s=3600)
    assert newer["deleted"] == [] and {s["checkpoint_id"]: s["reason"] for s in newer["spared"]} == {
        "step-1": "kept",
        "step-2": "newer",
        "final": "final",
    }
    size = {
        c["checkpoint_id"]: c["size_bytes"] for c in owner.api.list_checkpoints(job.job_id)["checkpoints"]
    }
    dry = owner.api.prune_checkpoints(job.job_id, dry_run=True)
    assert (dry["dry_run"], dry["deleted"], dry["freed_bytes"]) == (True, ["step-2"], size["step-2"])
    assert len(owner.api.list_checkpoints(job.job_id)["checkpoints"]) == 3
    before = files_on_disk(backend.data_dir, job.job_id)
    done = owner.api.prune_checkpoints(job.job_id)
    assert done["deleted"] == ["step-2"] and {s["checkpoint_id"] for s in done["spared"]} == {
        "step-1",
        "final",
    }
    assert [c["checkpoint_id"] for c in owner.api.list_checkpoints(job.job_id)["checkpoints"]] == [
        "step-1",
        "final",
    ]
    assert files_on_disk(backend.data_dir, job.job_id) == before - size["step-2"]
    assert owner.api.keep_checkpoint(job.job_id, "step-1", False)["kept"] is False
    with pytest.raises(errors.BadRequestError) as bad:
        owner.api.call("prune_checkpoints", {"job_id": job.job_id}, json={"older_than_s": -1})
    assert bad.value.detail["field"] == "older_than_s"


def test_checkpoints_magic_shows_lineage_and_storage_and_prunes(cortex_shell, owner, trained):
    job, _ = trained
    listed = {c["checkpoint_id"]: c for c in owner.api.list_checkpoints(job.job_id)["checkpoints"]}
    ran = run_cell(cortex_shell, f"%cortex checkpoints {job.job_id}")
    assert ran.success, ran.stderr
    frame = ran.result
    assert list(frame["checkpoint_id"]) == list(listed) == ["step-1", "final"]
    assert list(frame["size"]) == [format_bytes(listed[c]["size_bytes"]) for c in listed]
    assert list(frame["exports"]) == [1, 0] and frame["loaded_into"].iloc[1].startswith("job-")
    assert (
        f"storage-run: step 3, 2 checkpoint(s), {format_bytes(sum(c['size_bytes'] for c in listed.values()))}"
        in ran.stdout
    )
    dry = run_cell(cortex_shell, f"%cortex checkpoints {job.job_id} --prune --dry-run")
    assert dry.success and "would delete 1 checkpoint(s)" in dry.stdout and "final (final)" in dry.stdout
    assert len(owner.api.list_checkpoints(job.job_id)["checkpoints"]) == 2
    storage = run_cell(cortex_shell, "%cortex checkpoints")
    assert storage.success, storage.stderr
    mine = storage.result[storage.result["owner"] == "storage-owner"]
    assert set(mine["job_id"]) >= {job.job_id} and list(mine["size_bytes"]) == sorted(
        mine["size_bytes"], reverse=True
    )
    (meter,) = [line for line in storage.stdout.splitlines() if line.startswith("storage-owner: ")]
    used = owner.api.storage()["owners"][0]["used_bytes"]
    assert meter.startswith(f"storage-owner: {format_bytes(used)} ")
    bad = run_cell(cortex_shell, f"%cortex checkpoints {job.job_id} --prune --older-than soon")
    assert not bad.success and "not a duration" in bad.stdout + bad.stderr


def test_rename_tag_and_delete_a_job(backend, owner, stranger):
    job = owner.create_training_job("tiny", name="to-rename", lora={"r": 2})
    renamed = owner.api.update_job(job.job_id, name="renamed", labels={"dataset": "lamps", "try": "2"})
    assert (renamed["name"], renamed["labels"]) == ("renamed", {"dataset": "lamps", "try": "2"})
    listed = owner.api.list_jobs(label="dataset=lamps")["jobs"]
    assert [row["job_id"] for row in listed] == [job.job_id]
    assert (
        owner.api.update_job(job.job_id, labels={})["labels"] == {}
        and owner.api.get_job(job.job_id)["name"] == "renamed"
    )
    for body, code, field in (
        ({}, "invalid_request", None),
        ({"labels": {"Bad": "x"}}, "invalid_field", "labels.Bad"),
    ):
        answer = httpx.patch(
            f"{backend.url}/v1/jobs/{job.job_id}",
            json=body,
            headers={"Authorization": f"Bearer {backend.token}"},
        )
        assert answer.status_code == 400 and answer.json()["error"]["code"] == code
        assert answer.json()["error"]["detail"].get("field") == field
    theirs = httpx.patch(f"{backend.url}/v1/jobs/{job.job_id}", json={"name": "mine"}, headers=stranger)
    assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "job_not_found"
    # A job still going is not deleted.
    with pytest.raises(errors.ConflictError) as running:
        owner.api.delete_job(job.job_id)
    assert running.value.code == "job_not_finished"
    train(job, random_batches(1, TINY_VOCAB, seed=9))
    job.save("only").result()
    owner.api.keep_checkpoint(job.job_id, "only")
    job.cancel()
    with pytest.raises(errors.ConflictError) as kept:
        owner.api.delete_job(job.job_id)
    assert kept.value.code == "checkpoint_kept" and kept.value.detail["checkpoints"] == ["only"]
    gone_for_them = httpx.delete(f"{backend.url}/v1/jobs/{job.job_id}", headers=stranger)
    assert gone_for_them.status_code == 404
    owner.api.keep_checkpoint(job.job_id, "only", False)
    size = owner.api.list_checkpoints(job.job_id)["checkpoints"][0]["size_bytes"]
    deleted = owner.api.delete_job(job.job_id)
    assert deleted == {
        "job_id": job.job_id,
        "deleted": True,
        "checkpoints_deleted": ["only"],
        "freed_bytes": size,
    }
    assert files_on_disk(backend.data_dir, job.job_id) == 0
    with pytest.raises(errors.NotFoundError):
        owner.api.get_job(job.job_id)
    assert job.job_id not in {row["job_id"] for row in owner.api.storage()["owners"][0]["jobs"]}


def test_sampling_on_demand_marks_its_job_short_lived(owner, trained):
    _, other = trained
    started = time.time()
    result = sample_checkpoint(owner.api, owner.api.get_job(other.job_id), ["The"], {"max_tokens": 2})
    assert result.checkpoint_id == "step-1"
    (label,) = SHORT_LIVED["sample"].items()
    marked = owner.api.list_jobs(label="=".join(label), since=started)["jobs"]
    assert [row["name"] for row in marked] == [f"sample {other.job_id}"]
    lineage = owner.api.job_lineage(other.job_id)
    assert [use["job_id"] for use in lineage["checkpoints"][0]["uses"]] == [marked[0]["job_id"]]
