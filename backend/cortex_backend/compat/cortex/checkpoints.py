"""Checkpoints: list, export (short-lived download links to the adapter files, which plain peft loads),
delete, and the download behind each link."""

from __future__ import annotations

import asyncio

from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from ...checkpoints import CheckpointManager
from .base import CortexHandler
from .jobs import iso
from .signed_urls import FileGrant

READ_BYTES = 1 << 20


class CheckpointsHandler(CortexHandler):
    def get(self, database: str, schema: str, job_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        self.write_json(
            {
                "checkpoints": [
                    {
                        "checkpoint_id": row["checkpoint_id"],
                        "global_steps": row["step"],
                        "checkpoint_type": row["type"],
                        "created_at": iso(row["created_at"]),
                        "size_bytes": row["size_bytes"],
                        "base_model": row["base_model"],
                        "files": row["files"],
                    }
                    for row in self.service.checkpoints.list(job)
                ]
            }
        )


class CheckpointExportHandler(CortexHandler):
    """POST /{job_id}/checkpoints/{checkpoint_id}:export: links to adapter_config.json and
    adapter_model.safetensors, valid for an hour."""

    def post(self, database: str, schema: str, job_id: str, checkpoint_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        plan = self.service.checkpoints.begin_export(self.principal, job, checkpoint_id, "adapter")
        self.service.checkpoints.end_export(plan)  # only the listing is needed here; downloads hold it again
        base = (
            f"{self.request.protocol}://{self.request.host}{self.request.path.rsplit(':export', 1)[0]}/files"
        )
        files, expires = [], 0
        for name, _, size in plan.files:
            query, expires = self.face.links.query(FileGrant(job["owner"], job_id, checkpoint_id, name))
            files.append(
                {
                    "filename": name,
                    "url": f"{base}/{name}?{query}",
                    "size_bytes": size,
                    "sha256": plan.checkpoint["manifest"]["files"][name]["sha256"],
                }
            )
        self.write_json(
            {
                "checkpoint_id": checkpoint_id,
                "job_id": job_id,
                "files": files,
                "expires_at": iso(expires),
                "format": "peft-adapter",
            }
        )


class CheckpointHandler(CortexHandler):
    def delete(self, database: str, schema: str, job_id: str, checkpoint_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        self.write_json(self.service.checkpoints.delete(self.principal, job, checkpoint_id))


class CheckpointFileHandler(CortexHandler):
    """GET .../checkpoints/{checkpoint_id}/files/{filename}?owner=&expires=&signature=: no token, the link is the grant."""

    async def get(self, database: str, schema: str, job_id: str, checkpoint_id: str, filename: str) -> None:
        owner = self.get_query_argument("owner", "")
        self.face.links.check(
            FileGrant(owner, job_id, checkpoint_id, filename),
            self.get_query_argument("expires", ""),
            self.get_query_argument("signature", ""),
        )
        reader = Principal(token_id="download-link", owner=owner, scopes=frozenset({"jobs:read"}))
        job = self.service.jobs.visible_job(reader, job_id)
        plan = self.service.checkpoints.begin_export(reader, job, checkpoint_id, "adapter")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, CheckpointManager.verify_files, plan)
            found = [(path, size) for name, path, size in plan.files if name == filename]
            if not found:
                raise ApiError("not_found", f"checkpoint {checkpoint_id} exports no file {filename!r}")
            path, size = found[0]
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(size))
            self.set_header("Content-Disposition", f'attachment; filename="{filename}"')
            with open(path, "rb") as handle:
                while block := await loop.run_in_executor(None, handle.read, READ_BYTES):
                    self.write(block)
                    await self.flush()
        finally:
            self.service.checkpoints.end_export(plan)
        self.finish()
