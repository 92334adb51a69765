"""What the SDK's RestClient reads: server capabilities, training runs, checkpoints, sessions and samplers,
each rendered from the service's own records (a checkpoint listed here is the one `%cortex checkpoints` shows)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from . import names, translate
from .face import TinkerFace

MAX_LISTED = 1000


def _time(at: float | None) -> str:
    return datetime.fromtimestamp(at or 0.0, tz=timezone.utc).isoformat()


def capabilities(face: TinkerFace) -> dict[str, Any]:
    return {
        "supported_models": [
            {
                "model_name": model["name"],
                "max_context_length": model["max_positions"],
                "trainable": True,
                "sampleable": True,
            }
            for model in face.service.catalog.list()
        ]
    }


def checkpoint(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "checkpoint_id": names.tinker_checkpoint_id(row["id"]),
        "checkpoint_type": names.checkpoint_kind(row["id"]),
        "time": _time(row["created_at"]),
        "tinker_path": names.tinker_path(row["job_id"], row["id"]),
        "size_bytes": row["size_bytes"],
        "public": bool(row.get("public")),
        "expires_at": None if row.get("expires_at") is None else _time(row["expires_at"]),
    }


def checkpoints(face: TinkerFace, principal: Principal, training_run_id: str) -> dict[str, Any]:
    job = _job(face, principal, training_run_id)
    return {
        "checkpoints": [checkpoint(row) for row in face.service.store.list_checkpoints(job["id"])],
        "cursor": None,
    }


def user_checkpoints(face: TinkerFace, principal: Principal, limit: int, offset: int) -> dict[str, Any]:
    store = face.service.store
    jobs = sorted({row["job_id"] for row in store.all_checkpoints() if principal.can_see(row["owner"])})
    rows = sorted(
        (row for job_id in jobs for row in store.list_checkpoints(job_id)), key=lambda row: -row["created_at"]
    )
    return {
        "checkpoints": [checkpoint(row) for row in rows[offset : offset + limit]],
        "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)},
    }


def _owned(
    face: TinkerFace, principal: Principal, training_run_id: str, kind: str, name: str
) -> tuple[dict[str, Any], str]:
    """(job, checkpoint id) of a checkpoint this key owns (or, as admin, may see): what may be changed."""
    if kind not in names.KINDS:
        raise ApiError(
            "checkpoint_not_found", f"{kind}/{name}: checkpoints are weights/<name> or sampler_weights/<name>"
        )
    return _job(face, principal, training_run_id), names.checkpoint_id(kind, name)


def delete_checkpoint(
    face: TinkerFace, principal: Principal, training_run_id: str, kind: str, name: str
) -> None:
    job, checkpoint_id = _owned(face, principal, training_run_id, kind, name)
    face.service.checkpoints.delete(principal, job, checkpoint_id)


def set_public(
    face: TinkerFace, principal: Principal, training_run_id: str, kind: str, name: str, public: bool
) -> None:
    job, checkpoint_id = _owned(face, principal, training_run_id, kind, name)
    face.service.checkpoints.set_public(principal, job, checkpoint_id, public)


def set_ttl(
    face: TinkerFace, principal: Principal, training_run_id: str, kind: str, name: str, ttl_seconds: Any
) -> None:
    job, checkpoint_id = _owned(face, principal, training_run_id, kind, name)
    face.service.checkpoints.set_ttl(principal, job, checkpoint_id, ttl_seconds)


def _job(face: TinkerFace, principal: Principal, training_run_id: str) -> dict[str, Any]:
    try:
        return face.service.jobs.visible_job(principal, names.job_id_for(training_run_id))
    except ApiError as exc:
        raise ApiError(
            "model_not_found", f"no training run {training_run_id!r} is visible to this key"
        ) from exc


def training_run(face: TinkerFace, principal: Principal, training_run_id: str) -> dict[str, Any]:
    return _training_run(face, _job(face, principal, training_run_id))


def _training_run(face: TinkerFace, job: dict[str, Any]) -> dict[str, Any]:
    trainer = next((sub for sub in job["sub_jobs"] if sub["type"] == states.TRAINING), job["sub_jobs"][0])
    saved = face.service.store.list_checkpoints(job["id"])
    last = {
        kind: [row for row in saved if names.checkpoint_kind(row["id"]) == kind]
        for kind in ("training", "sampler")
    }
    return {
        "training_run_id": names.training_run_id_for(job["id"]),
        "base_model": trainer["spec"]["base_model"],
        "model_owner": job["owner"],
        "is_lora": True,
        "corrupted": job["status"] == states.JOB_FAILED,
        "lora_rank": (trainer["spec"].get("lora") or {}).get("r"),
        "last_request_time": _time(job["last_activity_at"]),
        "last_checkpoint": checkpoint(last["training"][-1]) if last["training"] else None,
        "last_sampler_checkpoint": checkpoint(last["sampler"][-1]) if last["sampler"] else None,
        "user_metadata": None,
    }


def training_runs(face: TinkerFace, principal: Principal, limit: int, offset: int) -> dict[str, Any]:
    listed = face.service.jobs.list(principal, None, MAX_LISTED, None)["jobs"]
    trainers = [job for job in listed if any(sub["type"] == states.TRAINING for sub in job["sub_jobs"])]
    page = [_training_run(face, job) for job in trainers[offset : offset + limit]]
    return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(trainers)}}


def weights_info(face: TinkerFace, principal: Principal, path: Any) -> dict[str, Any]:
    job_id, checkpoint_id, _ = names.parse_path(path)
    row = face.service.checkpoints.find(principal, principal.owner, job_id, checkpoint_id, reading=True)
    adapter = row["manifest"].get("adapter") or {}
    try:
        model_type = str(face.service.catalog.get(row["base_model"]).config.get("model_type", ""))
    except ApiError:  # a checkpoint outlives its model's registration
        model_type = ""
    return {
        "base_model": row["base_model"],
        "is_lora": True,
        "lora_rank": adapter.get("r"),
        **translate.lora_flags(adapter.get("target_modules"), model_type),
    }


def session(face: TinkerFace, principal: Principal, session_id: str) -> dict[str, Any]:
    found = face.sessions.find(principal, session_id)
    return {
        "training_run_ids": [names.training_run_id_for(job_id) for job_id in found.models.values()],
        "sampler_ids": list(found.samplers.values()),
        "user_metadata": found.user_metadata or None,
        "display_name": found.display_name,
    }


def sessions(face: TinkerFace, principal: Principal) -> dict[str, Any]:
    return {"sessions": [found.id for found in face.sessions.visible(principal)]}


def sampler(face: TinkerFace, principal: Principal, sampler_id: str) -> dict[str, Any]:
    found = face.sessions.sampling.get(sampler_id)
    if found is None or not principal.can_see(found.owner):
        raise ApiError("session_not_found", f"no sampler {sampler_id!r} is visible to this key")
    path = found.model_path
    if path is None and found.checkpoint is not None:
        path = names.tinker_path(*found.checkpoint)
    return {"sampler_id": found.id, "base_model": found.base_model, "model_path": path}


def storage_usage(face: TinkerFace, principal: Principal) -> dict[str, Any]:
    """The checkpoints' bytes on disk (what each row's size_bytes records), per owner this key may see; no rate, as
    there is no billing."""
    store = face.service.store
    counts: dict[str, int] = {}
    for row in store.all_checkpoints():
        if principal.can_see(row["owner"]):
            counts[row["owner"]] = counts.get(row["owner"], 0) + 1
    data = []
    for owner, count in sorted(counts.items()):
        size = store.checkpoint_bytes(owner)
        data.append(
            {
                "org_user_urn": owner,
                "checkpoint_count": count,
                "size_bytes": size,
                "size_gigabytes": size / 1e9,
            }
        )
    return {"effective_rate_usd_per_gigabyte_month": None, "data": data}
