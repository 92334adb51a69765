"""A job's lineage as data: job → the step its training reached → each checkpoint (bytes, keep mark) →
where its weights went (exports, loads into sub-jobs, samplings of it as a saved adapter), and the job's
weight syncs to its samplers. Backwards too: `origins`, the other jobs' checkpoints its weights came from
(a load, a run's `init_from`, a checkpoint copy), then theirs, back to a job that started from nothing.
Read from the store's rows: nothing is recorded twice."""

from __future__ import annotations

from typing import Any

from .auth import Principal
from .jobs import JobManager
from .progress import ProgressBook
from .store import Store

# What a weight sync's result keeps in the lineage (the rest is per-target detail): the path taken, the
# trainer's weight version (its step) that was sent, the bytes sent and the hash of the weights.
SYNC_RESULT_KEYS = ("path", "weight_version", "bytes", "source_hash")
# How many origins `origins` lists at most (a chain of loads back and forth cannot grow it without end).
MAX_ORIGINS = 64


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
            "origins": self.origins(principal, job),
        }

    def origins(self, principal: Principal, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Where the job's weights came from, nearest first: each origin of the job (oldest first), then each
        of their jobs' origins, breadth first. A job this principal may not see (a published checkpoint of
        another owner's) is listed but not followed; a job met twice is followed once."""
        found: list[dict[str, Any]] = []
        followed = {job["id"]}
        queue = [job]
        while queue and len(found) < MAX_ORIGINS:
            taker = queue.pop(0)
            for origin in self._direct_origins(taker):
                source = self.store.get_job(origin["source_job_id"])
                visible = source is not None and principal.can_see(source["owner"])
                checkpoint = self.store.get_checkpoint(origin["source_job_id"], origin["checkpoint_id"])
                exports = (
                    [
                        {"at": row["at"], "contents": row["contents"]}
                        for row in self.store.checkpoint_exports(origin["source_job_id"])
                        if row["checkpoint_id"] == origin["checkpoint_id"]
                    ]
                    if visible
                    else []
                )
                found.append(
                    {
                        **origin,
                        "job_id": taker["id"],
                        "source_name": source["name"] if visible else None,
                        "step": checkpoint["step"] if checkpoint is not None else None,
                        "checkpoint_exists": checkpoint is not None,
                        "exports": exports,
                    }
                )
                if visible and source["id"] not in followed:
                    followed.add(source["id"])
                    queue.append(source)
        return found[:MAX_ORIGINS]

    def _direct_origins(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Another job's checkpoint this job took weights from: its copy source, its run's `init_from`, the
        succeeded loads of another job's checkpoint into its sub-jobs; oldest first."""
        spec = job["spec"]
        found = []
        copied = spec.get("copied_from") or _label_origin((spec.get("labels") or {}).get("copied_from"))
        if copied:
            found.append(_origin("copy", copied["job"], copied["checkpoint"], None, None, job["created_at"]))
        init = (spec.get("training_loop") or {}).get("init_from")
        if init:
            found.append(_origin("init_from", init["job"], init["checkpoint"], None, None, job["created_at"]))
        for row in self.store.job_loads(job["id"]):
            params = row["params"]
            source = params.get("source_job_id")
            if (
                isinstance(source, str)
                and source != job["id"]
                and isinstance(params.get("checkpoint_id"), str)
            ):
                found.append(
                    _origin(
                        "load",
                        source,
                        params["checkpoint_id"],
                        row["id"],
                        row["sub_job_id"],
                        row["created_at"],
                    )
                )
        return found


def _origin(
    via: str, job_id: str, checkpoint_id: str, request_id: str | None, sub_job_id: str | None, at: float
) -> dict[str, Any]:
    return {
        "via": via,
        "source_job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "request_id": request_id,
        "sub_job_id": sub_job_id,
        "at": at,
    }


def _label_origin(label: Any) -> dict[str, str] | None:
    """A copy made before copies recorded their origin in the spec: its `copied_from` label, job/checkpoint."""
    if not isinstance(label, str) or label.count("/") != 1:
        return None
    job_id, checkpoint_id = label.split("/")
    return {"job": job_id, "checkpoint": checkpoint_id}


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
