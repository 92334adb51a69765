"""Checkpoints of a job: list (filtered), read one, keep or delete one, delete in bulk (prune), export one as
a streamed tar; and an owner's checkpoint storage."""

from __future__ import annotations

import asyncio
import hashlib

from cortex_nb.protocol.checkpoint_format import MANIFEST, MANIFEST_SHA_HEADER

from ..checkpoint_copies import copy_checkpoint
from ..checkpoints import CheckpointManager, public_checkpoint
from ..tar_stream import END_OF_ARCHIVE, archive_size, member_header, padding
from .base import BaseHandler

EXPORT_READ_BYTES = 1 << 20


class CheckpointsHandler(BaseHandler):
    def get(self, job_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        query = self.query_args()
        self.write_json({"job_id": job_id, "checkpoints": self.service.checkpoints.list(job, query)})


class CheckpointPruneHandler(BaseHandler):
    def post(self, job_id: str) -> None:
        self.write_json(self.service.checkpoint_storage.prune(self.principal, job_id, self.parse_body()))


class StorageHandler(BaseHandler):
    def get(self) -> None:
        self.write_json(self.service.checkpoint_storage.usage(self.principal, self.query_args().owner))


class CheckpointHandler(BaseHandler):
    def get(self, job_id: str, checkpoint_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        self.write_json(public_checkpoint(self.service.checkpoints.get(self.principal, job, checkpoint_id)))

    def patch(self, job_id: str, checkpoint_id: str) -> None:
        """The checkpoint's lifecycle: a TTL from now (or none), published or not, kept or not."""
        update = self.parse_body()
        job = self.service.jobs.visible_job(self.principal, job_id)
        manager = self.service.checkpoints
        row = public_checkpoint(manager.get(self.principal, job, checkpoint_id))
        if "ttl_seconds" in update.model_fields_set:
            row = manager.set_ttl(self.principal, job, checkpoint_id, update.ttl_seconds)
        if update.public is not None:
            row = manager.set_public(self.principal, job, checkpoint_id, update.public)
        if update.kept is not None:
            row = manager.set_kept(self.principal, job, checkpoint_id, update.kept)
        self.write_json(row)

    def delete(self, job_id: str, checkpoint_id: str) -> None:
        if self.replay_if_seen():
            return
        job = self.service.jobs.visible_job(self.principal, job_id)
        response = self.service.checkpoints.delete(self.principal, job, checkpoint_id)
        self.remember(200, response)
        self.write_json(response)


class CheckpointCopyHandler(BaseHandler):
    """A copy in a new record-only job of the caller (checkpoint_copies.py); the source may be another owner's
    published checkpoint, so it is found by reading rights, not by seeing its job."""

    def post(self, job_id: str, checkpoint_id: str) -> None:
        body = self.parse_body()
        manager = self.service.checkpoints
        source = manager.find(self.principal, self.principal.owner, job_id, checkpoint_id, reading=True)
        copied = copy_checkpoint(self.service.store, manager, self.principal, source, body.ttl_seconds)
        self.write_json(copied, 201)


class CheckpointExportHandler(BaseHandler):
    """A tar of the adapter directory (or, with ?contents=all, every checkpoint file), manifest first.

    The files are checked against their SHA-256 before the first byte is sent; the manifest's own
    SHA-256 travels in a header so the client can check everything on arrival.
    """

    async def get(self, job_id: str, checkpoint_id: str) -> None:
        job = self.service.jobs.visible_job(self.principal, job_id)
        contents = self.query_args().contents
        plan = self.service.checkpoints.begin_export(self.principal, job, checkpoint_id, contents)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, CheckpointManager.verify_files, plan)
            mtime = plan.checkpoint["created_at"]
            self.set_header("Content-Type", "application/x-tar")
            self.set_header(
                "Content-Length",
                str(archive_size([len(plan.manifest)] + [size for _, _, size in plan.files])),
            )
            self.set_header("Content-Disposition", f'attachment; filename="{job_id}-{checkpoint_id}.tar"')
            self.set_header(MANIFEST_SHA_HEADER, hashlib.sha256(plan.manifest).hexdigest())
            self.write(
                member_header(MANIFEST, len(plan.manifest), mtime)
                + plan.manifest
                + padding(len(plan.manifest))
            )
            for name, path, size in plan.files:
                self.write(member_header(name, size, mtime))
                with open(path, "rb") as handle:
                    while True:
                        block = await loop.run_in_executor(None, handle.read, EXPORT_READ_BYTES)
                        if not block:
                            break
                        self.write(block)
                        await self.flush()
                self.write(padding(size))
            self.write(END_OF_ARCHIVE)
            await self.flush()
        finally:
            self.service.checkpoints.end_export(plan)
        self.finish()
