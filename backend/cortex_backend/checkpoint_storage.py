"""What checkpoints cost and how to clear them: bytes per owner (against the quota) and per job, deleting a
job's checkpoints in bulk (all but `final` and the kept ones, or those older than), and forgetting a
finished job with its checkpoints. A checkpoint marked keep is never deleted in bulk; one a load or export
reads is spared and said so."""

from __future__ import annotations

import time
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.checkpoints import PruneCheckpoints

from .auth import Principal
from .checkpoints import CheckpointManager
from .jobs import JobManager
from .listings import owner_scope
from .store import Store

FINAL = "final"


class CheckpointStorage:
    def __init__(self, store: Store, jobs: JobManager, checkpoints: CheckpointManager) -> None:
        self.store = store
        self.jobs = jobs
        self.checkpoints = checkpoints

    def usage(self, principal: Principal, owner: str | None) -> dict[str, Any]:
        """`GET /v1/storage`: per owner (one, or an admin's everyone), bytes used against the quota and
        per job. An owner with no checkpoint is listed with 0 when it is the one asked about."""
        scope = owner_scope(principal, owner)
        by_owner: dict[str, dict[str, Any]] = {}
        if scope is not None:
            by_owner[scope] = _owner_entry(scope, self.checkpoints.quota_bytes)
        for row in self.store.storage_by_job(scope):
            entry = by_owner.setdefault(
                row["owner"], _owner_entry(row["owner"], self.checkpoints.quota_bytes)
            )
            entry["used_bytes"] += row["size_bytes"]
            entry["checkpoint_count"] += row["checkpoint_count"]
            entry["jobs"].append(
                {
                    "job_id": row["job_id"],
                    "name": row["name"],
                    "status": row["status"] or "forgotten",
                    "checkpoint_count": row["checkpoint_count"],
                    "kept_count": row["kept_count"],
                    "size_bytes": row["size_bytes"],
                }
            )
        return {"owners": [by_owner[name] for name in sorted(by_owner)]}

    def prune(self, principal: Principal, job_id: str, body: PruneCheckpoints) -> dict[str, Any]:
        """Delete the job's checkpoints but `final` (unless `keep_final` is false), the kept ones, those in
        use, and (with `older_than_s`) those newer than that; answer what went and what was spared, and why."""
        job = self.jobs.visible_job(principal, job_id)
        now = time.time()
        deleted: list[str] = []
        spared: list[dict[str, str]] = []
        freed = 0
        for row in self.store.list_checkpoints(job["id"]):
            reason = None
            if body.keep_final and row["id"] == FINAL:
                reason = "final"
            elif row.get("kept"):
                reason = "kept"
            elif body.older_than_s is not None and now - row["created_at"] <= body.older_than_s:
                reason = "newer"
            elif self.checkpoints.readers(row) > 0:
                reason = "in_use"
            if reason is not None:
                spared.append({"checkpoint_id": row["id"], "reason": reason})
                continue
            if not body.dry_run:
                self.checkpoints.remove(row)
            deleted.append(row["id"])
            freed += row["size_bytes"]
        return {
            "job_id": job["id"],
            "dry_run": body.dry_run,
            "deleted": deleted,
            "freed_bytes": freed,
            "spared": spared,
        }

    def delete_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """Forget a job that has ended: its checkpoints (refused if one is kept or read), then its record,
        requests and logs. A job still going is refused: cancel or complete it first."""
        job = self.jobs.visible_job(principal, job_id)
        if job["status"] not in states.JOB_TERMINAL:
            raise ApiError(
                "job_not_finished",
                f"job {job_id} is {job['status']}; cancel it (POST /v1/jobs/{job_id}/cancel) or let it finish,"
                " then delete it",
                {"status": job["status"]},
            )
        rows = self.store.list_checkpoints(job["id"])
        kept = [row["id"] for row in rows if row.get("kept")]
        if kept:
            raise ApiError(
                "checkpoint_kept",
                f"job {job_id} keeps checkpoint(s) {', '.join(kept)}; take the keep mark off"
                ' (PATCH .../checkpoints/{checkpoint_id} {"kept": false}) before deleting the job',
                {"checkpoints": kept},
            )
        busy = [row["id"] for row in rows if self.checkpoints.readers(row) > 0]
        if busy:
            raise ApiError(
                "checkpoint_in_use",
                f"checkpoint(s) {', '.join(busy)} of job {job_id} are being read by a load or export;"
                " delete the job once they finish",
                {"checkpoints": busy},
            )
        freed = 0
        for row in rows:
            self.checkpoints.remove(row)
            freed += row["size_bytes"]
        self.store.forget_job(job["id"])
        return {
            "job_id": job["id"],
            "deleted": True,
            "checkpoints_deleted": [row["id"] for row in rows],
            "freed_bytes": freed,
        }


def _owner_entry(owner: str, quota_bytes: int | None) -> dict[str, Any]:
    return {"owner": owner, "used_bytes": 0, "quota_bytes": quota_bytes, "checkpoint_count": 0, "jobs": []}
