"""Taking a source run in: its spec and files verified, its submission id kept to one run for good, and its
place in the device queue (priority, then submission time)."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.priority import DEFAULT_PRIORITY
from cortex_nb.protocol.schemas.runs import CreateRun

from ..auth import Principal
from ..config import BackendSettings
from ..models import ModelCatalog
from ..priorities import granted_priority
from ..scheduler import Scheduler
from ..store import Store
from ..uploads import UploadStore
from .archive import validate_manifest, verify_archive
from .spec import validate_run_spec

RUN_KIND = "run"


def new_run_id() -> str:
    return "run-" + secrets.token_hex(6)


class RunAdmission:
    """Submissions of source runs: one run per submission id, queued once verified."""

    def __init__(
        self,
        settings: BackendSettings,
        store: Store,
        catalog: ModelCatalog,
        scheduler: Scheduler,
        uploads: UploadStore,
        admit: Callable[[], None],
        system_log: Callable[[str, str], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.scheduler = scheduler
        self.uploads = uploads
        self.admit = admit
        self._system_log = system_log
        self._submitting: dict[tuple[str, str], asyncio.Future] = {}

    async def submit(self, principal: Principal, body: CreateRun) -> tuple[dict[str, Any], bool]:
        """Create the run, or return the one this submission id already made; (run, created)."""
        submission_id = body.submission_id or "sub-" + secrets.token_hex(8)
        existing = self.store.run_by_submission(principal.owner, submission_id)
        if existing is not None:
            return self._same_submission(existing, body), False
        key = (principal.owner, submission_id)
        in_flight = self._submitting.get(key)
        if in_flight is not None:
            return self._same_submission(await asyncio.shield(in_flight), body), False
        future = asyncio.get_running_loop().create_future()
        self._submitting[key] = future
        try:
            run = await self._create(principal, submission_id, body)
            future.set_result(run)
            return run, True
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so an unawaited copy never warns
            raise
        finally:
            del self._submitting[key]

    def _same_submission(self, run: dict[str, Any], body: CreateRun) -> dict[str, Any]:
        """A repeated submission id must carry the same spec and files: it is a retry, never a new run."""
        spec = validate_run_spec(body.spec, self.catalog, self.scheduler)
        manifest = validate_manifest(body.manifest, spec)
        if spec != run["spec"] or manifest != run["manifest"]:
            raise ApiError(
                "conflict",
                f"submission id {run['submission_id']!r} already made run {run['id']} with another"
                " spec or other files; use a new submission id for a new run",
                {"run_id": run["id"]},
            )
        return run

    async def _create(self, principal: Principal, submission_id: str, body: CreateRun) -> dict[str, Any]:
        spec = validate_run_spec(body.spec, self.catalog, self.scheduler)
        manifest = validate_manifest(body.manifest, spec)
        # Refused here when the token may not ask it; queued (`_enqueue`) at the spec's band.
        granted_priority(principal, spec.get("priority"), self.settings.token_max_priority, "spec.priority")
        run_id = new_run_id()
        run_dir = self.settings.runs_dir / run_id
        run_dir.mkdir(parents=True)
        archive_path = run_dir / "source.tar"
        try:
            archive = body.archive
            if archive is None:
                if manifest:
                    raise ApiError(
                        "invalid_field",
                        "archive: required when the manifest lists files",
                        {"field": "archive"},
                    )
                await asyncio.to_thread(_write_empty_tar, archive_path)
            else:
                await asyncio.to_thread(
                    self.uploads.take_to_file, principal, archive.upload_id, archive.sha256, archive_path
                )
            await asyncio.to_thread(verify_archive, archive_path, manifest)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        self.store.insert_run(
            {
                "id": run_id,
                "owner": principal.owner,
                "submission_id": submission_id,
                "name": spec["name"],
                "status": states.JOB_PENDING,
                "spec": spec,
                "manifest": manifest,
            }
        )
        self.enqueue(self.store.get_run(run_id))
        self._system_log(
            run_id,
            f"run {run_id} ({spec['name']}) accepted: {len(manifest)} file(s) verified; queued for a device",
        )
        self.admit()
        return self.store.get_run(run_id)

    def enqueue(self, run: dict[str, Any]) -> None:
        """Queue the run for its devices at its priority, in its place by submission time."""
        spec = run["spec"]
        gpu = spec["resources"]["gpu"]
        priority = spec.get("priority", DEFAULT_PRIORITY)
        if gpu["count"]:
            self.scheduler.enqueue(
                run["id"],
                gpu["count"],
                int(gpu["min_vram_gib"] * 2**30),
                kind=RUN_KIND,
                exclusive=True,
                priority=priority,
                submitted_at=run["created_at"],
            )
        else:
            self.scheduler.enqueue(
                run["id"], 1, kind=RUN_KIND, priority=priority, submitted_at=run["created_at"]
            )


def _write_empty_tar(path: Path) -> None:
    with tarfile.open(path, "w"):
        pass
