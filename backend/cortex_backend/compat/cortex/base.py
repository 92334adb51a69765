"""What every handler of the Cortex SDK surface shares: the face's bookkeeping, its route table (Bearer auth,
the SDK's token-type header ignored; scopes by route), the database/schema labels, and errors with statuses
the SDK reacts to well (compat/face.py is the template)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ...keyed_turns import KeyedTurns
from ...service import Service
from ..face import FaceHandler
from ..face_errors import cortex_status
from .chunk_groups import ChunkGroups
from .errors import reason_phrase
from .routes import ROUTES
from .signed_urls import LinkSigner

# The SDK's chunk frames are up to 60 MiB (its _MAX_FWD_BWD_BYTES), plus the frame's own header.
FRAME_BODY_LIMIT = 64 * 1024 * 1024


@dataclass
class CortexFace:
    """The surface's own bookkeeping: open chunk groups and the download-link key (no store of its own)."""

    service: Service
    chunk_groups: ChunkGroups = field(init=False)
    links: LinkSigner = field(default_factory=LinkSigner)
    # generate-stream requests not yet drained, by the request id the SDK holds (streaming.py)
    streams: dict[str, Any] = field(default_factory=dict)
    # Per chunk group: its lock and how many chunks hold or wait for it.
    _turns: KeyedTurns = field(default_factory=KeyedTurns)

    def __post_init__(self) -> None:
        settings = self.service.settings
        # Open groups' chunks are spooled beside /v1 uploads; an owner may hold as many bytes of them as
        # of unused uploads (--upload-quota-bytes).
        self.chunk_groups = ChunkGroups(
            self.service.store, settings.data_dir / "cortex-chunk-groups", settings.upload_quota_bytes
        )

    @contextlib.asynccontextmanager
    async def group_turn(self, key: tuple[str, str, str]) -> AsyncIterator[None]:
        """One chunk of a group at a time: a retried last chunk waits until the first attempt was
        submitted and remembered, then replays its answer (the work between runs in threads)."""
        async with self._turns.turn(key):
            yield


class CortexHandler(FaceHandler):
    """A Cortex SDK route (routes.py): our auth, scopes and errors, with the statuses the SDK reacts to well
    and the code and message in the reason phrase (the SDK shows only `requests.HTTPError`'s text)."""

    face: CortexFace
    routes_served = ROUTES
    sdk_status = staticmethod(cortex_status)

    def error_reason(self, code: str, message: str) -> str | None:
        return reason_phrase(code, message)

    def labels(self) -> tuple[str, str]:
        """The database and schema the SDK put in the path: free labels, recorded on jobs it creates."""
        return self.path_kwargs["database"], self.path_kwargs["schema"]

    @property
    def operation(self) -> str:
        """The operation this route names (`cortex:step` -> `step`)."""
        return self.route.name.removeprefix("cortex:")
