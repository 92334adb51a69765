"""The SDK's request chunk groups: chunks of one frame, posted in order, that become one request, once.

A group is known from its chunk 0 until it is assembled. Open groups are not kept across a restart, on
purpose: after a backend restart a later chunk of a group finds nothing and is answered
`chunk_group_restart_required`, which makes the SDK replay the group from chunk 0 (once). An assembled
group is remembered in the service's idempotency records (keyed by owner, job and group id, bound to the
frame's SHA-256), so a retried final chunk answers the first request id again instead of running the
operation twice; the same group id with another frame is `chunk_group_conflict`.

Bounded like `/v1` uploads (uploads.py): each chunk is written to a file under the data dir as it
arrives (memory holds only its size and SHA-256), the bytes an owner's open groups hold are counted as
they arrive against a per-owner share, all groups together against a disk cap, and `total_chunks` is
bounded. Methods that touch files run in a thread (the handler's), never on the IO loop.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from ...store import Store
from .dssst1 import Chunk

GROUP_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# Bytes all open groups together may hold on disk before new chunks are refused (a client that gives up
# half-way leaves its chunks there until OPEN_GROUP_TTL_S passes).
MAX_OPEN_BYTES = 16 * 1024**3
OPEN_GROUP_TTL_S = 3600.0
# The SDK cuts a frame (at most 1 GiB) into chunks of up to 60 MiB; a test of ours uses 16 KiB chunks.
MAX_TOTAL_CHUNKS = 65_536


@dataclass
class OpenGroup:
    owner: str
    frame_sha256: str
    frame_size: int
    total: int
    operation: str | None
    folder: Path
    started_at: float = field(default_factory=time.monotonic)
    parts: dict[int, tuple[int, str]] = field(default_factory=dict)  # index -> (size, SHA-256)
    held_bytes: int = 0


def _conflict(group_id: str, message: str) -> ApiError:
    return ApiError(
        "chunk_group_conflict",
        f"chunk group {group_id}: {message}; send the frame under a new group id",
        {"chunk_group_id": group_id},
    )


class ChunkGroups:
    def __init__(
        self,
        store: Store,
        root: Path,
        owner_share_bytes: int,
        max_open_bytes: int = MAX_OPEN_BYTES,
        ttl_s: float = OPEN_GROUP_TTL_S,
    ) -> None:
        self.store = store
        self.root = root
        # Nothing can resume a group across a restart: the files of the last run go.
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.owner_share_bytes = owner_share_bytes
        self.max_open_bytes = max_open_bytes
        self.ttl_s = ttl_s
        self._open: dict[tuple[str, str, str], OpenGroup] = {}
        # Chunks of different groups are handled in threads at once: one lock keeps the counts right.
        self._lock = threading.Lock()

    @staticmethod
    def _record_key(job_id: str, group_id: str) -> str:
        return f"cortex-chunk-group:{job_id}:{group_id}"

    def submitted(self, principal: Principal, job_id: str, chunk: Chunk) -> dict[str, Any] | None:
        """The answer of a group that already ran: for its last chunk the first response, else an ack."""
        if chunk.group_id is None:
            return None
        seen = self.store.idempotent_response(principal.owner, self._record_key(job_id, chunk.group_id))
        if seen is None:
            return None
        if seen["body_sha256"] != chunk.frame_sha256:
            raise _conflict(chunk.group_id, "it already ran with another frame")
        if chunk.index == chunk.total - 1:
            return {**seen["response"], "replayed": True}
        return received(chunk)

    def held_bytes(self, owner: str | None = None) -> int:
        """Bytes of chunks open groups hold (one owner's, or everyone's)."""
        with self._lock:
            return sum(g.held_bytes for g in self._open.values() if owner is None or g.owner == owner)

    def add(self, principal: Principal, job_id: str, chunk: Chunk) -> mmap.mmap | bytes | None:
        """Keep one chunk; return the whole frame once the group's last chunk arrives (and forget the group).
        Runs in a thread; the caller handles one group's chunks one at a time."""
        group_id = chunk.group_id or "ungrouped-" + chunk.frame_sha256
        self._check(group_id, chunk)
        key = (principal.owner, job_id, group_id)
        self._expire()
        digest = hashlib.sha256(chunk.payload).hexdigest()
        with self._lock:
            group = self._open.get(key)
            if group is None:
                group = self._open_group(key, group_id, chunk)
            elif (group.frame_sha256, group.frame_size, group.total) != (
                chunk.frame_sha256,
                chunk.frame_size,
                chunk.total,
            ):
                raise _conflict(group_id, "a chunk names another frame (SHA-256, size or chunk count)")
            earlier = group.parts.get(chunk.index)
            if earlier is not None and earlier[1] != digest:
                raise _conflict(group_id, f"chunk {chunk.index} was sent before with other bytes")
            if earlier is None:
                self._reserve(group, group_id, len(chunk.payload))
                group.parts[chunk.index] = (len(chunk.payload), digest)
        if earlier is None:
            try:
                path = group.folder / f"{chunk.index:06d}"
                path.with_suffix(".partial").write_bytes(chunk.payload)
                path.with_suffix(".partial").replace(path)
            except OSError as exc:
                with self._lock:
                    group.parts.pop(chunk.index, None)
                    group.held_bytes -= len(chunk.payload)
                raise ApiError(
                    "rate_limited", f"the backend could not keep chunk {chunk.index}: {exc.strerror}; retry"
                ) from None
        if chunk.index != chunk.total - 1:
            return None
        missing = sorted(set(range(group.total)) - set(group.parts))
        if missing:
            raise ApiError(
                "chunk_group_missing_chunks",
                f"chunk group {group_id} lacks chunk(s) {missing[:10]}",
                {"chunk_group_id": group_id, "missing": missing[:100]},
            )
        with self._lock:
            self._open.pop(key, None)
        try:
            return self._assemble(group, group_id)
        finally:
            shutil.rmtree(group.folder, ignore_errors=True)

    @staticmethod
    def _check(group_id: str, chunk: Chunk) -> None:
        if not GROUP_ID.fullmatch(group_id):
            raise ApiError("invalid_frame", "chunk_group_id: letters, digits and '_.:-' only, at most 128")
        if chunk.frame_size > wire.MAX_FRAME_BYTES:
            raise ApiError(
                "body_too_large",
                f"the frame is {chunk.frame_size} bytes; the limit is {wire.MAX_FRAME_BYTES}",
            )
        if chunk.total > min(MAX_TOTAL_CHUNKS, max(1, chunk.frame_size)):
            raise ApiError(
                "invalid_frame",
                f"total_chunks {chunk.total}: a frame of {chunk.frame_size} bytes travels in at most"
                f" {min(MAX_TOTAL_CHUNKS, max(1, chunk.frame_size))} chunks",
                {"field": "total_chunks"},
            )

    def _open_group(self, key: tuple[str, str, str], group_id: str, chunk: Chunk) -> OpenGroup:
        if chunk.index != 0:
            raise ApiError(
                "chunk_group_restart_required",
                f"chunk group {group_id} is unknown here (the backend restarted, or chunk 0 never arrived);"
                " send it again from chunk 0",
                {"chunk_group_id": group_id, "chunk_idx": chunk.index},
            )
        owner = key[0]
        held = sum(g.held_bytes for g in self._open.values() if g.owner == owner)
        if held + chunk.frame_size > self.owner_share_bytes:
            raise self._over_share(held, chunk.frame_size)
        folder = self.root / owner.encode().hex() / uuid.uuid4().hex
        folder.mkdir(parents=True)
        group = self._open[key] = OpenGroup(
            owner, chunk.frame_sha256, chunk.frame_size, chunk.total, chunk.operation, folder
        )
        return group

    def _reserve(self, group: OpenGroup, group_id: str, size: int) -> None:
        """Count a new chunk's bytes against its frame, its owner's share and the disk cap (lock held)."""
        if group.held_bytes + size > group.frame_size:
            raise _conflict(group_id, f"its chunks hold more than the frame's {group.frame_size} bytes")
        held = sum(g.held_bytes for g in self._open.values() if g.owner == group.owner)
        if held + size > self.owner_share_bytes:
            raise self._over_share(held, size)
        if sum(g.held_bytes for g in self._open.values()) + size > self.max_open_bytes:
            raise ApiError(
                "rate_limited", "too many chunked frames are being uploaded at once; retry shortly"
            )
        group.held_bytes += size

    def _over_share(self, held: int, needed: int) -> ApiError:
        return ApiError(
            "quota_exceeded",
            f"this token's owner has {held:,} bytes of chunks in open chunk groups and may hold"
            f" {self.owner_share_bytes:,}; finish (or let expire, after {self.ttl_s:g} s) the groups it"
            " started, or ask the operator to raise --upload-quota-bytes",
            {"quota_bytes": self.owner_share_bytes, "used_bytes": held, "needed_bytes": needed},
        )

    @staticmethod
    def _assemble(group: OpenGroup, group_id: str) -> mmap.mmap | bytes:
        """The chunk files read into one anonymous map, hashed as they come (as `UploadStore.take`)."""
        if group.held_bytes != group.frame_size:
            raise _conflict(group_id, "the assembled frame does not match its SHA-256 or size")
        if not group.frame_size:
            if hashlib.sha256(b"").hexdigest() != group.frame_sha256:
                raise _conflict(group_id, "the assembled frame does not match its SHA-256 or size")
            return b""
        data = mmap.mmap(-1, group.frame_size)
        view, digest, offset = memoryview(data), hashlib.sha256(), 0
        for index in range(group.total):
            size = group.parts[index][0]
            with open(group.folder / f"{index:06d}", "rb") as handle:
                read = handle.readinto(view[offset : offset + size])
            if read != size:
                raise _conflict(group_id, f"chunk {index} changed on disk")
            digest.update(view[offset : offset + size])
            offset += size
        view.release()
        if digest.hexdigest() != group.frame_sha256:
            raise _conflict(group_id, "the assembled frame does not match its SHA-256 or size")
        return data

    def remember(self, principal: Principal, job_id: str, chunk: Chunk, response: dict[str, Any]) -> None:
        """Bind the group to the request it started, so a retried last chunk gets the same answer."""
        if chunk.group_id is not None:
            self.store.remember_response(
                principal.owner, self._record_key(job_id, chunk.group_id), chunk.frame_sha256, 202, response
            )

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [k for k, g in self._open.items() if now - g.started_at > self.ttl_s]
            folders = [self._open.pop(key).folder for key in expired]
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def received(chunk: Chunk) -> dict[str, Any]:
    """The answer to a chunk before the last: no request id (the SDK checks that)."""
    return {
        "chunk_group_id": chunk.group_id,
        "chunk_idx": chunk.index,
        "total_chunks": chunk.total,
        "status": "received",
    }
