"""Checkpoints on disk and in the store: reserve, commit, list, load, export, delete, recover.

Layout: DATA_DIR/checkpoints/<owner as hex>/<job_id>/<checkpoint_id>/ (the owner is hex-encoded
because token names may hold any character). A worker writes a save into a `.tmp-*` directory next
to its final place; when it reports success the service checks the files, applies the quota,
renames the directory into place, and only then inserts the store row that makes the checkpoint
valid. A crash at any point leaves either a temporary directory (removed at start-up) or nothing.

Checkpoints outlive their job: a finished job's checkpoints are listed, exported and loaded into
another job of the same owner. A checkpoint being read (by a queued or running load, or an export)
cannot be deleted.

Lifecycle: a checkpoint may carry an expiry time (a TTL given at save or later; checkpoint_expiry.py deletes it
once past) and may be published: a published checkpoint is readable (loaded, sampled) by every token of this
backend, while only its owner may change or delete it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cortex_nb.protocol.checkpoint_format import (
    CHECKPOINT_TYPES,
    EXPORT_ADAPTER,
    EXPORT_CONTENTS,
    MANIFEST,
    RESUMABLE,
    WEIGHTS_ONLY,
    encode_manifest,
    export_manifest,
    matches,
)
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.data_plane import LoadBody, SaveBody

from .auth import Principal
from .durable import fsync_directory
from .storage_faults import is_storage_error
from .store import Store
from .validation import ID_PATTERN, validate_identifier

log = logging.getLogger("cortex_backend.checkpoints")

TEMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
# Bytes per adapter parameter: fp32 weights, and for a resumable save two fp32 AdamW moments more.
BYTES_PER_PARAMETER = {WEIGHTS_ONLY: 4, RESUMABLE: 12}
ESTIMATE_OVERHEAD_BYTES = 64 * 1024
# A TTL's bounds (Tinker's: 1 hour to 10 years). The backend may accept shorter ones (--checkpoint-min-ttl).
MIN_TTL_S = 3600
MAX_TTL_S = 10 * 365 * 24 * 3600
# What must agree between a checkpoint (or a trainer) and the sub-job taking its weights.
ADAPTER_SHAPE_KEYS = ("base_model", "r", "lora_alpha", "target_modules")


def validate_checkpoint_id(value: Any) -> str:
    """1-64 letters, digits, '_', '.', '-', starting with a letter or digit: never a path."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ApiError(
            "invalid_checkpoint_id",
            f"checkpoint_id {str(value)[:80]!r} is not allowed: use 1-64 letters, digits, '_', '.' or '-',"
            " starting with a letter or digit (no slashes, no leading dot)",
            {"field": "checkpoint_id"},
        )
    return value


def check_adapters_match(
    theirs: dict[str, Any] | None, ours: dict[str, Any] | None, what: str, into: str
) -> None:
    """Refuse weights whose base model, rank, alpha or target modules differ from the receiver's."""
    if not theirs or not ours:
        return
    different = [key for key in ADAPTER_SHAPE_KEYS if theirs.get(key) != ours.get(key)]
    if different:
        detail = {key: {"source": theirs.get(key), "target": ours.get(key)} for key in different}
        raise ApiError(
            "incompatible_adapter",
            f"{what} does not fit {into}: {', '.join(different)} differ ("
            + "; ".join(f"{key} {theirs.get(key)!r} vs {ours.get(key)!r}" for key in different)
            + "). Load it into a sub-job created with the same base model and LoRA settings.",
            detail,
        )


def public_checkpoint(row: dict[str, Any]) -> dict[str, Any]:
    manifest = row["manifest"]
    return {
        "checkpoint_id": row["id"],
        "job_id": row["job_id"],
        "sub_job_id": row["sub_job_id"],
        "type": row["type"],
        "step": row["step"],
        "created_at": row["created_at"],
        "size_bytes": row["size_bytes"],
        "base_model": row["base_model"],
        "state_hash": manifest.get("state_hash"),
        "adapter": manifest.get("adapter"),
        "files": sorted(manifest.get("files", {})),
        "expires_at": row.get("expires_at"),
        "public": bool(row.get("public")),
        "kept": bool(row.get("kept")),
    }


@dataclass
class PendingSave:
    owner: str
    job_id: str
    sub_job_id: str
    requested_id: str | None
    kind: str
    directory: Path
    estimated_bytes: int
    ttl_seconds: int | None = None


@dataclass
class ExportPlan:
    """What an export streams: (name, path, size) per file, after the manifest."""

    key: tuple[str, str]
    manifest: bytes
    files: list[tuple[str, Path, int]]
    checkpoint: dict[str, Any]


class CheckpointManager:
    def __init__(self, store: Store, root: Path, quota_bytes: int | None, min_ttl_s: int = MIN_TTL_S) -> None:
        self.store = store
        self.root = root
        self.quota_bytes = quota_bytes
        self.min_ttl_s = min_ttl_s
        self.root.mkdir(parents=True, exist_ok=True)
        self._saves: dict[str, PendingSave] = {}
        self._readers: Counter[tuple[str, str]] = Counter()
        self._load_reads: dict[str, tuple[str, str]] = {}

    # paths ------------------------------------------------------------------------------------
    def job_dir(self, owner: str, job_id: str) -> Path:
        return self.root / owner.encode().hex() / validate_identifier(job_id, "job_id")

    def path(self, row: dict[str, Any]) -> Path:
        return self.job_dir(row["owner"], row["job_id"]) / validate_checkpoint_id(row["id"])

    # start-up ---------------------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Remove what a crash left: temporary and half-deleted directories, directories without a
        valid row (renamed but not recorded), and rows whose directory is gone."""
        valid = {
            (row["owner"].encode().hex(), row["job_id"], row["id"]) for row in self.store.all_checkpoints()
        }
        removed = {"temporary": 0, "unrecorded": 0, "missing": 0}
        for owner_dir in [p for p in self.root.iterdir() if p.is_dir()]:
            for job_dir in [p for p in owner_dir.iterdir() if p.is_dir()]:
                for entry in list(job_dir.iterdir()):
                    if entry.name.startswith((TEMP_PREFIX, TRASH_PREFIX)):
                        shutil.rmtree(entry, ignore_errors=True)
                        removed["temporary"] += 1
                    elif (owner_dir.name, job_dir.name, entry.name) not in valid:
                        if entry.is_dir():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink(missing_ok=True)
                        removed["unrecorded"] += 1
        for row in self.store.all_checkpoints():
            if not self.path(row).is_dir():
                log.warning(
                    "checkpoint %s of job %s has no directory any more; forgetting it",
                    row["id"],
                    row["job_id"],
                )
                self.store.delete_checkpoint(row["job_id"], row["id"])
                removed["missing"] += 1
        if any(removed.values()):
            log.info("checkpoint recovery: %s", removed)
        return removed

    # quota ------------------------------------------------------------------------------------
    def used_bytes(self, owner: str) -> int:
        """Bytes kept plus bytes reserved by saves in flight."""
        reserved = sum(save.estimated_bytes for save in self._saves.values() if save.owner == owner)
        return self.store.checkpoint_bytes(owner) + reserved

    def check_quota(self, owner: str, used: int, needed: int, when: str) -> None:
        if self.quota_bytes is not None and used + needed > self.quota_bytes:
            raise ApiError(
                "quota_exceeded",
                f"checkpoint quota exceeded ({when}): owner {owner!r} uses {used:,} of {self.quota_bytes:,} bytes and this"
                f" checkpoint needs {needed:,}; delete checkpoints you no longer need (DELETE"
                " /v1/jobs/{job_id}/checkpoints/{checkpoint_id}) or ask the operator to raise --checkpoint-quota-bytes."
                " Nothing was written.",
                {"quota_bytes": self.quota_bytes, "used_bytes": used, "needed_bytes": needed},
            )

    # save -------------------------------------------------------------------------------------
    def _id_taken(self, job_id: str, checkpoint_id: str) -> bool:
        pending = any(s.job_id == job_id and s.requested_id == checkpoint_id for s in self._saves.values())
        return pending or self.store.get_checkpoint(job_id, checkpoint_id) is not None

    def prepare_save(
        self, request_id: str, job: dict[str, Any], sub: dict[str, Any], body: SaveBody
    ) -> dict[str, Any]:
        """Reserve a save's id and its estimated bytes, and choose its temporary directory."""
        kind = body.type
        requested = body.checkpoint_id
        ttl = self.validate_ttl(body.ttl_seconds)
        if requested is not None:
            if self._id_taken(job["id"], requested):
                raise ApiError(
                    "checkpoint_exists",
                    f"job {job['id']} already has a checkpoint {requested!r}; choose another"
                    " checkpoint_id, omit it for an automatic one, or delete the old one first",
                )
        parameters = int((sub.get("info") or {}).get("trainable_parameters") or 0)
        estimate = parameters * BYTES_PER_PARAMETER[kind] + ESTIMATE_OVERHEAD_BYTES
        self.check_quota(job["owner"], self.used_bytes(job["owner"]), estimate, "estimated before saving")
        job_dir = self.job_dir(job["owner"], job["id"])
        job_dir.mkdir(parents=True, exist_ok=True)
        directory = job_dir / f"{TEMP_PREFIX}{request_id}-{secrets.token_hex(4)}"
        self._saves[request_id] = PendingSave(
            job["owner"], job["id"], sub["id"], requested, kind, directory, estimate, ttl
        )
        return {"type": kind, "checkpoint_id": requested, "directory": str(directory)}

    def adopt(
        self,
        request_id: str,
        job: dict[str, Any],
        sub_job_id: str,
        name: str,
        kind: str,
        directory: str,
        manifest: dict[str, Any],
    ) -> dict[str, Any]:
        """Make valid a checkpoint a managed training loop wrote (`name`, or `name-2`... if taken), exactly
        as a finished save request is: files checked, quota applied, renamed, recorded."""
        job_dir = self.job_dir(job["owner"], job["id"])
        path = Path(directory)
        if path.parent != job_dir or not path.name.startswith(TEMP_PREFIX) or kind not in CHECKPOINT_TYPES:
            raise ApiError(
                "internal_error",
                f"a training loop reported a checkpoint outside its job's directory: {directory}",
            )
        self._saves.pop(request_id, None)  # a retried report: its own reservation does not take the name
        unique = self.free_name(job["id"], validate_checkpoint_id(name))
        self._saves[request_id] = PendingSave(job["owner"], job["id"], sub_job_id, unique, kind, path, 0)
        return self.commit_save(request_id, {"manifest": manifest})

    def free_name(self, job_id: str, name: str) -> str:
        """`name`, or `name-2`, `name-3`, ... if a checkpoint of the job (or a save in flight) has it."""
        unique, suffix = name, 1
        while self._id_taken(job_id, unique):
            suffix += 1
            unique = f"{name}-{suffix}"
        return unique

    def _final_id(self, save: PendingSave, step: int) -> str:
        if save.requested_id is not None:
            return save.requested_id
        candidate, suffix = f"step-{step}", 1
        while self._id_taken(save.job_id, candidate):
            suffix += 1
            candidate = f"step-{step}-{suffix}"
        return candidate

    def commit_save(self, request_id: str, result: dict[str, Any]) -> dict[str, Any]:
        """Make a finished save valid: check its files, apply the quota, rename, record. On a failure
        the temporary directory is removed and the save fails; nothing is listed. When only the store
        refused the record, everything is as before the call (files, reservation) and the error is raised
        for the caller to retry the whole report."""
        save = self._saves.pop(request_id, None)
        if save is None:
            raise ApiError("internal_error", f"save {request_id} has no reservation")
        try:
            manifest = result["manifest"]
            size = (save.directory / MANIFEST).stat().st_size
            for name, expected in manifest["files"].items():
                actual = (save.directory / name).stat().st_size
                if actual != expected["size"]:
                    raise ApiError(
                        "checkpoint_corrupted",
                        f"{name} has {actual} bytes on disk but the worker wrote {expected['size']}",
                    )
                size += actual
            self.check_quota(save.owner, self.used_bytes(save.owner), size, "measured after writing")
            checkpoint_id = self._final_id(save, int(manifest["step"]))
            final = save.directory.parent / checkpoint_id
            if final.exists():  # left by a crash between rename and record: never valid
                shutil.rmtree(final)
            os.rename(save.directory, final)
            fsync_directory(final.parent)
            created = time.time()
            row = {
                "job_id": save.job_id,
                "id": checkpoint_id,
                "owner": save.owner,
                "sub_job_id": save.sub_job_id,
                "type": save.kind,
                "step": int(manifest["step"]),
                "size_bytes": size,
                "base_model": manifest["adapter"]["base_model"],
                "manifest": manifest,
                "request_id": request_id,
                "created_at": created,
                "expires_at": None if save.ttl_seconds is None else created + save.ttl_seconds,
            }
            try:
                self.store.insert_checkpoint(row)
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                # The store refused the record (a held lock, a full disk): undo the rename and keep the
                # reservation, so that the report's retry commits the same files under the same id.
                os.rename(final, save.directory)
                self._saves[request_id] = save
                raise
        except ApiError:
            shutil.rmtree(save.directory, ignore_errors=True)
            raise
        except (OSError, KeyError, TypeError, ValueError) as exc:
            shutil.rmtree(save.directory, ignore_errors=True)
            raise ApiError(
                "operation_failed", f"the checkpoint could not be made valid: {type(exc).__name__}: {exc}"
            ) from None
        return public_checkpoint(self.store.get_checkpoint(save.job_id, checkpoint_id))

    # load -------------------------------------------------------------------------------------
    def find(
        self, principal: Principal, owner: str, job_id: str, checkpoint_id: str, *, reading: bool = False
    ) -> dict[str, Any]:
        """A valid checkpoint of a job that `owner` owns and `principal` may see; 404 otherwise. With
        `reading` (a load, a sample), a published checkpoint is found whoever owns it."""
        validate_checkpoint_id(checkpoint_id)
        job = self.store.get_job(job_id) if ID_PATTERN.match(str(job_id)) else None
        row = self.store.get_checkpoint(job_id, checkpoint_id) if job is not None else None
        if row is not None and reading and row.get("public"):
            return row
        if row is None or not principal.can_see(job["owner"]) or job["owner"] != owner:
            raise ApiError(
                "checkpoint_not_found",
                f"job {job_id!r} has no checkpoint {checkpoint_id!r} visible to this token;"
                f" list them with GET /v1/jobs/{job_id}/checkpoints",
            )
        return row

    def prepare_load(
        self, request_id: str, principal: Principal, job: dict[str, Any], sub: dict[str, Any], body: LoadBody
    ) -> dict[str, Any]:
        source_job_id = body.source_job_id or job["id"]
        row, directory = self._hold_for_reading(
            request_id, principal, job, sub, source_job_id, body.checkpoint_id
        )
        return {
            "directory": str(directory),
            "manifest": row["manifest"],
            "checkpoint_id": row["id"],
            "source_job_id": source_job_id,
            "type": row["type"],
            "restore_optimizer": body.restore_optimizer,
        }

    def prepare_adapter(
        self, request_id: str, principal: Principal, job: dict[str, Any], sub: dict[str, Any], adapter: Any
    ) -> dict[str, Any] | str:
        """What a generate or forward runs on instead of the live adapter: "base" (no adapter), or
        `{"checkpoint_id", "job_id"?}` (`SavedAdapter`), a checkpoint of this owner whose adapter fits the
        sub-job (held against deletion until the request ends)."""
        if adapter == "base":
            return "base"
        if (
            not isinstance(adapter, dict)
            or set(adapter) - {"checkpoint_id", "job_id"}
            or "checkpoint_id" not in adapter
        ):
            raise ApiError(
                "invalid_field",
                'adapter: must be "base" or {"checkpoint_id", "job_id"?} naming a checkpoint (job_id defaults to this job)',
                {"field": "adapter"},
            )
        source_job_id = adapter.get("job_id") or job["id"]
        if not isinstance(source_job_id, str):
            raise ApiError("invalid_field", "adapter.job_id: must be a job id", {"field": "adapter.job_id"})
        row, directory = self._hold_for_reading(
            request_id, principal, job, sub, source_job_id, adapter["checkpoint_id"]
        )
        return {
            "key": f"{row['job_id']}/{row['id']}",
            "directory": str(directory),
            "manifest": row["manifest"],
        }

    def _hold_for_reading(
        self,
        request_id: str,
        principal: Principal,
        job: dict[str, Any],
        sub: dict[str, Any],
        source_job_id: str,
        checkpoint_id: Any,
    ) -> tuple[dict[str, Any], Path]:
        """Find a checkpoint the job's owner owns, check it fits the sub-job, and count this request as its reader."""
        row = self.find(principal, job["owner"], source_job_id, checkpoint_id, reading=True)
        check_adapters_match(
            row["manifest"].get("adapter"),
            (sub.get("info") or {}).get("adapter"),
            f"checkpoint {row['id']} of job {source_job_id}",
            f"sub-job {sub['id']}",
        )
        directory = self.path(row)
        if not directory.is_dir():
            raise ApiError(
                "checkpoint_corrupted", f"checkpoint {row['id']}'s files are missing on the backend"
            )
        key = (row["job_id"], row["id"])
        self._readers[key] += 1
        self._load_reads[request_id] = key
        return row, directory

    # requests ending --------------------------------------------------------------------------
    def request_ended(self, request_id: str) -> None:
        """Any save or load request ended (however): drop its reservation or its read."""
        save = self._saves.pop(request_id, None)
        if save is not None:
            shutil.rmtree(save.directory, ignore_errors=True)
        key = self._load_reads.pop(request_id, None)
        if key is not None:
            self._release(key)

    def _release(self, key: tuple[str, str]) -> None:
        self._readers[key] -= 1
        if self._readers[key] <= 0:
            del self._readers[key]

    # listing, deleting, exporting ---------------------------------------------------------------
    def list(self, job: dict[str, Any], query: Any = None) -> list[dict[str, Any]]:
        """The job's checkpoints, oldest first, narrowed by a `ListCheckpointsQuery` where given."""
        rows = self.store.list_checkpoints(job["id"])
        if query is not None:
            rows = [row for row in rows if _matches(row, query)]
        return [public_checkpoint(row) for row in rows]

    def get(self, principal: Principal, job: dict[str, Any], checkpoint_id: str) -> dict[str, Any]:
        return self.find(principal, job["owner"], job["id"], checkpoint_id)

    # lifecycle -------------------------------------------------------------------------------
    def validate_ttl(self, ttl_seconds: Any, field: str = "ttl_seconds") -> int | None:
        """None (never expires) or whole seconds within this backend's bounds."""
        if ttl_seconds is None:
            return None
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int)
            or not self.min_ttl_s <= ttl_seconds <= MAX_TTL_S
        ):
            raise ApiError(
                "invalid_field",
                f"{field}: must be whole seconds from {self.min_ttl_s} to {MAX_TTL_S} (10 years), or null for"
                f" no expiry; got {ttl_seconds!r}",
                {"field": field},
            )
        return ttl_seconds

    def set_ttl(
        self, principal: Principal, job: dict[str, Any], checkpoint_id: str, ttl_seconds: Any
    ) -> dict[str, Any]:
        """Expire the checkpoint `ttl_seconds` from now, or never (None)."""
        row = self.get(principal, job, checkpoint_id)
        ttl = self.validate_ttl(ttl_seconds)
        expires_at = None if ttl is None else time.time() + ttl
        self.store.set_checkpoint_lifecycle(row["job_id"], row["id"], expires_at=expires_at)
        return public_checkpoint(self.store.get_checkpoint(row["job_id"], row["id"]))

    def set_public(
        self, principal: Principal, job: dict[str, Any], checkpoint_id: str, public: bool
    ) -> dict[str, Any]:
        """Publish (every token may read it) or unpublish; asking for what already holds is a conflict."""
        row = self.get(principal, job, checkpoint_id)
        if bool(row.get("public")) == public:
            raise ApiError(
                "checkpoint_publication_unchanged",
                f"checkpoint {checkpoint_id} of job {job['id']} is already {'public' if public else 'private'}",
            )
        self.store.set_checkpoint_lifecycle(row["job_id"], row["id"], public=int(public))
        return public_checkpoint(self.store.get_checkpoint(row["job_id"], row["id"]))

    def set_kept(
        self, principal: Principal, job: dict[str, Any], checkpoint_id: str, kept: bool
    ) -> dict[str, Any]:
        row = self.get(principal, job, checkpoint_id)
        self.store.set_checkpoint_kept(row["job_id"], row["id"], kept)
        return public_checkpoint(self.get(principal, job, checkpoint_id))

    def readers(self, row: dict[str, Any]) -> int:
        """Loads, exports and requests reading the checkpoint now (it cannot be deleted while any does)."""
        return self._readers[(row["job_id"], row["id"])]

    def delete(self, principal: Principal, job: dict[str, Any], checkpoint_id: str) -> dict[str, Any]:
        row = self.get(principal, job, checkpoint_id)
        if row.get("kept"):
            raise ApiError(
                "checkpoint_kept",
                f"checkpoint {checkpoint_id} of job {job['id']} is marked keep; take the mark off first"
                f' (PATCH /v1/jobs/{job["id"]}/checkpoints/{checkpoint_id} {{"kept": false}}), then delete it',
                {"checkpoint_id": checkpoint_id},
            )
        return self.remove(row)

    def remove(self, row: dict[str, Any]) -> dict[str, Any]:
        """Delete a checkpoint's row, then its files; refused while a load or export reads it. The caller
        has checked who may, and the keep mark."""
        checkpoint_id = row["id"]
        key = (row["job_id"], row["id"])
        if self._readers[key] > 0:
            raise ApiError(
                "checkpoint_in_use",
                f"checkpoint {checkpoint_id} is being read by {self._readers[key]} load(s) or"
                " export(s); delete it once they finish",
                {"readers": self._readers[key]},
            )
        directory = self.path(row)
        self.store.delete_checkpoint(row["job_id"], row["id"])
        trash = directory.parent / f"{TRASH_PREFIX}{row['id']}-{secrets.token_hex(4)}"
        try:
            os.rename(directory, trash)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
        return {
            "checkpoint_id": row["id"],
            "job_id": row["job_id"],
            "deleted": True,
            "size_bytes": row["size_bytes"],
        }

    def begin_export(
        self, principal: Principal, job: dict[str, Any], checkpoint_id: str, contents: str
    ) -> ExportPlan:
        """Plan an export and hold the checkpoint against deletion until `end_export`."""
        if contents not in EXPORT_CONTENTS:
            raise ApiError(
                "invalid_field", f"contents: must be one of {list(EXPORT_CONTENTS)}", {"field": "contents"}
            )
        row = self.get(principal, job, checkpoint_id)
        directory = self.path(row)
        manifest = export_manifest(row, contents)
        self.store.record_export(row["job_id"], row["id"], contents)
        key = (row["job_id"], row["id"])
        self._readers[key] += 1
        files = [(name, directory / name, int(entry["size"])) for name, entry in manifest["files"].items()]
        return ExportPlan(key, encode_manifest(manifest), files, row)

    def begin_file_read(self, row: dict[str, Any], name: str) -> ExportPlan:
        """Hold one file of the adapter (as an export carries it) against deletion until `end_export`; the
        caller has checked the right to read it (a signed download URL)."""
        entries = export_manifest(row, EXPORT_ADAPTER)["files"]
        if name not in entries:
            raise ApiError(
                "not_found",
                f"checkpoint {row['id']} has no file {name[:80]!r}; its files are {sorted(entries)}",
            )
        key = (row["job_id"], row["id"])
        self._readers[key] += 1
        path = self.path(row) / name
        return ExportPlan(key, b"", [(name, path, int(entries[name]["size"]))], row)

    def end_export(self, plan: ExportPlan) -> None:
        self._release(plan.key)

    @staticmethod
    def verify_files(plan: ExportPlan) -> None:
        """Check every file against its recorded SHA-256 (run off the IO loop: it reads the files)."""
        for name, path, _size in plan.files:
            expected = plan.checkpoint["manifest"]["files"][name]
            digest = hashlib.sha256()
            try:
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):  # noqa: B023
                        digest.update(block)
            except OSError as exc:
                raise ApiError(
                    "checkpoint_corrupted",
                    f"{name} of checkpoint {plan.checkpoint['id']} cannot be read: {exc}",
                ) from None
            if not matches(expected, digest.hexdigest(), path.stat().st_size):
                raise ApiError(
                    "checkpoint_corrupted",
                    f"{name} of checkpoint {plan.checkpoint['id']} no longer matches its"
                    " SHA-256; the backend will not serve it. Save a new checkpoint.",
                )


def _matches(row: dict[str, Any], query: Any) -> bool:
    """Whether a checkpoint row passes a `ListCheckpointsQuery`'s filters."""
    return (
        (query.type is None or row["type"] == query.type)
        and (query.kept is None or bool(row.get("kept")) == query.kept)
        and (query.min_step is None or row["step"] >= query.min_step)
        and (query.max_step is None or row["step"] <= query.max_step)
        and (query.created_before is None or row["created_at"] < query.created_before)
        and (query.created_after is None or row["created_at"] >= query.created_after)
    )
