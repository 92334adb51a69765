"""Copies of a checkpoint: the same files under another owner's (or the same owner's) new job, so the copy
outlives the source's deletion, expiry or unpublishing. Files are hard links where the filesystem allows (no
bytes duplicated on disk), else copies; the quota counts the copy's bytes for its owner all the same.

The job holding a copy is a record only: created `done`, it never takes a device and cannot be trained on, but
its checkpoint is listed, loaded, sampled and exported like any other (`labels.copied_from` names the source).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from .auth import Principal
from .checkpoints import TEMP_PREFIX, CheckpointManager, public_checkpoint
from .durable import fsync_directory
from .jobs import new_job_id
from .store import Store


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def copy_checkpoint(
    store: Store,
    checkpoints: CheckpointManager,
    principal: Principal,
    source: dict[str, Any],
    ttl_seconds: int | None,
    job_id: str | None = None,
) -> dict[str, Any]:
    """Copy `source` (a row the principal may read) into a new record-only job `job_id` (default: a fresh id)
    owned by the principal; the copy keeps the checkpoint's id."""
    ttl = checkpoints.validate_ttl(ttl_seconds)
    checkpoints.check_quota(
        principal.owner, checkpoints.used_bytes(principal.owner), source["size_bytes"], "before copying"
    )
    job_id = job_id or new_job_id()
    if store.job_exists(job_id):
        raise ApiError("job_id_unavailable", f"job {job_id} exists already; copy into a new one")
    source_job = store.get_job(source["job_id"])
    trainer = next(
        (sub["spec"] for sub in (source_job or {}).get("sub_jobs", []) if sub["type"] == states.TRAINING),
        None,
    )
    adapter = source["manifest"].get("adapter") or {}
    sub_spec = trainer or {
        "type": states.TRAINING,
        "base_model": source["base_model"],
        "lora": {"r": adapter.get("r"), "alpha": adapter.get("lora_alpha")},
    }
    copied_from = f"{source['job_id']}/{source['id']}"
    spec = {
        "job_id": job_id,
        "name": f"copy of {copied_from}",
        "labels": {"copied_from": copied_from},
        # The origin as lineage reads it (lineage.py): labels are the owner's to change, this is not.
        "copied_from": {"job": source["job_id"], "checkpoint": source["id"]},
        "sub_jobs": [sub_spec],
    }
    store.insert_job(
        {
            "id": job_id,
            "owner": principal.owner,
            "name": spec["name"],
            "status": states.JOB_DONE,
            "spec": spec,
        },
        [{"id": "training-0", "type": states.TRAINING, "status": states.JOB_DONE, "spec": sub_spec}],
    )
    store.update_job(job_id, finished_at=time.time())
    job_dir = checkpoints.job_dir(principal.owner, job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    temporary = job_dir / f"{TEMP_PREFIX}copy-{secrets.token_hex(4)}"
    temporary.mkdir()
    try:
        for entry in checkpoints.path(source).iterdir():
            _link_or_copy(entry, temporary / entry.name)
        final = job_dir / source["id"]
        os.rename(temporary, final)
        fsync_directory(job_dir)
    except OSError as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        raise ApiError("operation_failed", f"the checkpoint could not be copied: {exc}") from None
    created = time.time()
    store.insert_checkpoint(
        {
            **{key: source[key] for key in ("id", "sub_job_id", "type", "step", "size_bytes", "base_model")},
            "job_id": job_id,
            "owner": principal.owner,
            "manifest": source["manifest"],
            "created_at": created,
            "expires_at": None if ttl is None else created + ttl,
        }
    )
    return public_checkpoint(store.get_checkpoint(job_id, source["id"]))
