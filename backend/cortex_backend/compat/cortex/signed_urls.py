"""Short-lived download links for exported checkpoint files, as the SDK's `export_checkpoint` returns.

A link names owner, job, checkpoint, file and expiry, signed with HMAC-SHA256 under a key made at start
(so every link dies with the process, and after LINK_TTL_S). Whoever holds a link reads that one file,
as its owner could; nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import quote

from cortex_nb.protocol.errors import ApiError

LINK_TTL_S = 3600


@dataclass(frozen=True)
class FileGrant:
    owner: str
    job_id: str
    checkpoint_id: str
    filename: str


class LinkSigner:
    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _signature(self, grant: FileGrant, expires: int) -> str:
        message = "\0".join(
            (grant.owner, grant.job_id, grant.checkpoint_id, grant.filename, str(expires))
        ).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def query(self, grant: FileGrant, now: float | None = None) -> tuple[str, int]:
        """The query string of a link to `grant`, and when it expires (unix seconds)."""
        expires = int((now or time.time()) + LINK_TTL_S)
        return (
            f"owner={quote(grant.owner, safe='')}&expires={expires}&signature={self._signature(grant, expires)}",
            expires,
        )

    def check(self, grant: FileGrant, expires: str, signature: str) -> None:
        try:
            deadline = int(expires)
        except ValueError:
            deadline = 0
        if not hmac.compare_digest(self._signature(grant, deadline), signature or ""):
            raise ApiError(
                "forbidden", "this download link is not valid; ask export_checkpoint for a new one"
            )
        if deadline < time.time():
            raise ApiError("forbidden", "this download link has expired; ask export_checkpoint for a new one")
