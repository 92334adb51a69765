"""What every handler of the Cortex SDK surface shares: Bearer auth (the SDK's token-type header is
ignored), scopes by method, the database/schema labels, and errors with statuses the SDK reacts to well."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tornado.web

from cortex_nb.protocol import routes
from cortex_nb.protocol.errors import ApiError

from ...auth import authenticate
from ...handlers.base import BaseHandler
from ...service import Service
from ...validation import dumps_strict
from .chunk_groups import ChunkGroups
from .errors import reason_phrase, sdk_status
from .signed_urls import LinkSigner

# The SDK's chunk frames are up to 60 MiB (its _MAX_FWD_BWD_BYTES), plus the frame's own header.
FRAME_BODY_LIMIT = 64 * 1024 * 1024


@dataclass
class CortexFace:
    """The surface's own bookkeeping: open chunk groups and the download-link key (no store of its own)."""

    service: Service
    chunk_groups: ChunkGroups = field(init=False)
    links: LinkSigner = field(default_factory=LinkSigner)

    def __post_init__(self) -> None:
        self.chunk_groups = ChunkGroups(self.service.store)


class CortexHandler(BaseHandler):
    """Auth and errors for the SDK's paths (which are not in `cortex_nb.protocol.routes`: they are another API)."""

    face: CortexFace
    # Set by handlers that need no token (signed download links).
    authenticated = True

    def initialize(self, service: Service, face: CortexFace) -> None:  # type: ignore[override]
        super().initialize(service)
        self.face = face

    def prepare(self) -> None:
        if self.authenticated:
            self.principal = authenticate(self.service.store, self.request.headers.get("Authorization"))
            self.principal.require(routes.READ if self.request.method in ("GET", "HEAD") else routes.WRITE)
        self._body_limit = self.body_limit()
        declared = self._declared_length()
        if declared is not None and declared > self._body_limit:
            self._body_too_large = True
        self._accepted = True

    def labels(self) -> tuple[str, str]:
        """The database and schema the SDK put in the path: free labels, recorded on jobs it creates."""
        return self.path_kwargs["database"], self.path_kwargs["schema"]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            code, message, detail, status = exc.code, exc.message, exc.detail, exc.status
        elif isinstance(exc, tornado.web.HTTPError):
            code = "invalid_request" if exc.status_code < 500 else "internal_error"
            status, message, detail = exc.status_code, exc.log_message or self._reason, {}
        else:
            status, code, message, detail = (
                500,
                "internal_error",
                "the backend hit an unexpected error; it is logged",
                {},
            )
        status = sdk_status(code, status)
        if self._body_left_unread():
            self.set_header("Connection", "close")  # as the /v1 handlers do: the connection cannot be reused
        self.set_status(status, reason=reason_phrase(code, message))
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(dumps_strict({"error": {"code": code, "message": message, "detail": detail}}))

    def on_finish(self) -> None:
        metrics = getattr(self.service, "operator_metrics", None)
        if metrics is not None:
            metrics.observe_request(
                f"cortex:{type(self).__name__}",
                self.request.method,
                self.get_status(),
                self.request.request_time(),
                self.waited,
            )
