"""A job's lineage as data: job → the step its training reached → each checkpoint (bytes, keep mark) →
where its weights went (exports, loads into sub-jobs, samplings of it as a saved adapter), and the job's
weight syncs to its samplers. Read from the store's rows: nothing is recorded twice."""

from __future__ import annotations

from typing import Any

from .auth import Principal
from .jobs import JobManager
from .progress import ProgressBook
from .store import Store

# What a weight sync's result keeps in the lineage (the rest is per-target detail): the path taken, the
# trainer's weight version (its step) that was sent, the bytes sent and the hash of the weights.
SYNC_RESULT_KEYS = ("path", "weight_version", "bytes", "source_hash")


class Lineage:
    def __init__(self, store: Store, jobs: JobManager, progress: ProgressBook) -> None:
        self.store = store
        self.jobs = jobs
        self.progress = progress

    def of_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        job = self.jobs.visible_job(principal, job_id)
        uses = _uses_by_checkpoint(self.store.checkpoint_uses(job["owner"], job["id"]), job["id"])
        exports: dict[str, list[dict[str, Any]]] = {}
        for row in self.store.checkpoint_exports(job["id"]):
            exports.setdefault(row["checkpoint_id"], []).append(
                {"at": row["at"], "contents": row["contents"]}
            )
        checkpoints = [
            {
                "checkpoint_id": row["id"],
                "step": row["step"],
                "type": row["type"],
                "size_bytes": row["size_bytes"],
                "kept": bool(row.get("kept")),
                "created_at": row["created_at"],
                "exports": exports.get(row["id"], []),
                "uses": uses.get(row["id"], []),
            }
            for row in self.store.list_checkpoints(job["id"])
        ]
        progress = self.progress.public(job["id"])
        return {
            "job_id": job["id"],
            "name": job["name"],
            "status": job["status"],
            "step": progress["step"] if progress else None,
            "size_bytes": sum(entry["size_bytes"] for entry in checkpoints),
            "checkpoints": checkpoints,
            "weight_syncs": [_sync(row) for row in self.store.job_weight_syncs(job["id"])],
        }


def _uses_by_checkpoint(rows: list[dict[str, Any]], job_id: str) -> dict[str, list[dict[str, Any]]]:
    """Loads whose source is `job_id`, and generates/forwards whose saved adapter is one of its checkpoints."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        params = row["params"]
        if row["op"] == "load":
            if params.get("source_job_id") != job_id:
                continue
            checkpoint_id = params.get("checkpoint_id")
        else:
            adapter = params.get("adapter")
            if not isinstance(adapter, str) or not adapter.startswith(f"{job_id}/"):
                continue
            checkpoint_id = adapter.removeprefix(f"{job_id}/")
        if not isinstance(checkpoint_id, str):
            continue
        found.setdefault(checkpoint_id, []).append(
            {
                "job_id": row["job_id"],
                "sub_job_id": row["sub_job_id"],
                "request_id": row["id"],
                "op": row["op"],
                "status": row["status"],
                "at": row["created_at"],
            }
        )
    return found


def _sync(row: dict[str, Any]) -> dict[str, Any]:
    params, result = row["params"], row["result"]
    targets = params.get("targets")
    if isinstance(result, dict) and isinstance(result.get("targets"), list):
        targets = [target.get("sub_job_id") for target in result["targets"] if isinstance(target, dict)]
    return {
        "request_id": row["id"],
        "at": row["created_at"],
        "status": row["status"],
        "targets": targets,
        "format": params.get("format"),
        "result": {key: result[key] for key in SYNC_RESULT_KEYS if key in result}
        if isinstance(result, dict)
        else None,
    }
