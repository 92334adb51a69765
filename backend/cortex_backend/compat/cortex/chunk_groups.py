"""The SDK's request chunk groups: chunks of one frame, posted in order, that become one request, once.

A group is known from its chunk 0 until it is assembled. Open groups live in memory only, on purpose:
after a backend restart a later chunk of a group finds nothing and is answered
`chunk_group_restart_required`, which makes the SDK replay the group from chunk 0 (once). An assembled
group is remembered in the service's idempotency records (keyed by owner, job and group id, bound to the
frame's SHA-256), so a retried final chunk answers the first request id again instead of running the
operation twice; the same group id with another frame is `chunk_group_conflict`.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from ...auth import Principal
from ...store import Store
from .dssst1 import Chunk

GROUP_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# Bytes all open groups together may hold before new groups are refused (a client that gives up
# half-way leaves its chunks here until OPEN_GROUP_TTL_S passes).
MAX_OPEN_BYTES = 2 * 1024**3
OPEN_GROUP_TTL_S = 3600.0


@dataclass
class OpenGroup:
    frame_sha256: str
    frame_size: int
    total: int
    operation: str | None
    started_at: float = field(default_factory=time.monotonic)
    parts: dict[int, bytes] = field(default_factory=dict)

    @property
    def held_bytes(self) -> int:
        return sum(len(part) for part in self.parts.values())


def _conflict(group_id: str, message: str) -> ApiError:
    return ApiError(
        "chunk_group_conflict",
        f"chunk group {group_id}: {message}; send the frame under a new group id",
        {"chunk_group_id": group_id},
    )


class ChunkGroups:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._open: dict[tuple[str, str, str], OpenGroup] = {}

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

    def add(self, principal: Principal, job_id: str, chunk: Chunk) -> bytes | None:
        """Keep one chunk; return the whole frame once the group's last chunk arrives (and forget the group)."""
        group_id = chunk.group_id or "ungrouped-" + chunk.frame_sha256
        if not GROUP_ID.fullmatch(group_id):
            raise ApiError("invalid_frame", "chunk_group_id: letters, digits and '_.:-' only, at most 128")
        if chunk.frame_size > wire.MAX_FRAME_BYTES:
            raise ApiError(
                "body_too_large",
                f"the frame is {chunk.frame_size} bytes; the limit is {wire.MAX_FRAME_BYTES}",
            )
        key = (principal.owner, job_id, group_id)
        self._expire()
        group = self._open.get(key)
        if group is None:
            if chunk.index != 0:
                raise ApiError(
                    "chunk_group_restart_required",
                    f"chunk group {group_id} is unknown here (the backend restarted, or chunk 0 never arrived);"
                    " send it again from chunk 0",
                    {"chunk_group_id": group_id, "chunk_idx": chunk.index},
                )
            if sum(g.held_bytes for g in self._open.values()) + chunk.frame_size > MAX_OPEN_BYTES:
                raise ApiError(
                    "rate_limited", "too many chunked frames are being uploaded at once; retry shortly"
                )
            group = self._open[key] = OpenGroup(
                chunk.frame_sha256, chunk.frame_size, chunk.total, chunk.operation
            )
        elif (group.frame_sha256, group.frame_size, group.total) != (
            chunk.frame_sha256,
            chunk.frame_size,
            chunk.total,
        ):
            raise _conflict(group_id, "a chunk names another frame (SHA-256, size or chunk count)")
        earlier = group.parts.get(chunk.index)
        if earlier is not None and earlier != chunk.payload:
            raise _conflict(group_id, f"chunk {chunk.index} was sent before with other bytes")
        group.parts[chunk.index] = chunk.payload
        if chunk.index != chunk.total - 1:
            return None
        missing = sorted(set(range(group.total)) - set(group.parts))
        if missing:
            raise ApiError(
                "chunk_group_missing_chunks",
                f"chunk group {group_id} lacks chunk(s) {missing[:10]}",
                {"chunk_group_id": group_id, "missing": missing[:100]},
            )
        del self._open[key]
        frame = b"".join(group.parts[i] for i in range(group.total))
        if len(frame) != group.frame_size or hashlib.sha256(frame).hexdigest() != group.frame_sha256:
            raise _conflict(group_id, "the assembled frame does not match its SHA-256 or size")
        return frame

    def remember(self, principal: Principal, job_id: str, chunk: Chunk, response: dict[str, Any]) -> None:
        """Bind the group to the request it started, so a retried last chunk gets the same answer."""
        if chunk.group_id is not None:
            self.store.remember_response(
                principal.owner, self._record_key(job_id, chunk.group_id), chunk.frame_sha256, 202, response
            )

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, g in self._open.items() if now - g.started_at > OPEN_GROUP_TTL_S]:
            del self._open[key]


def received(chunk: Chunk) -> dict[str, Any]:
    """The answer to a chunk before the last: no request id (the SDK checks that)."""
    return {
        "chunk_group_id": chunk.group_id,
        "chunk_idx": chunk.index,
        "total_chunks": chunk.total,
        "status": "received",
    }
