"""Thin Tornado handlers: Jupyter auth (`@web.authenticated` + `@authorized`, XSRF on mutations via
Jupyter's own check), then the status report, starting the local backend, or one forwarded backend call.
"""

from __future__ import annotations

import asyncio
import json
from http.client import responses
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.httputil import HTTPHeaders
from tornado.iostream import StreamClosedError

from cortex_nb.protocol.errors import ApiError

from . import allowlist
from .backend import BackendConnection, request_headers_to_forward, response_headers_to_forward
from .discovery import SOURCE_LOCAL
from .local_start import LocalBackendStarter
from .status import status_report

AUTH_RESOURCE = "cortex"


class CortexAPIHandler(APIHandler):
    """Errors in the backend's shape, `{"error": {code, message, detail}}`, whatever raised them."""

    auth_resource = AUTH_RESOURCE

    def initialize(
        self, connection: BackendConnection, api_prefix: str, starter: LocalBackendStarter
    ) -> None:
        self.connection = connection
        self.starter = starter
        # "{base_url}cortex/api", the mount point; what follows it is the backend path.
        self.api_prefix = api_prefix

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            status, code, message, detail = exc.status, exc.code, exc.message, exc.detail
        elif isinstance(exc, web.HTTPError):
            status = exc.status_code
            code = {
                401: "unauthenticated",
                403: "forbidden",
                404: "route_not_found",
                405: "method_not_allowed",
            }.get(status, "invalid_request" if status < 500 else "internal_error")
            message, detail = exc.log_message or responses.get(status, "error"), {}
        else:
            status, code, message, detail = (
                500,
                "internal_error",
                "the Jupyter proxy hit an unexpected error; it is logged",
                {},
            )
        self.set_status(status)
        self.finish(json.dumps({"error": {"code": code, "message": message, "detail": detail}}))

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, ApiError):
            return  # an expected refusal, answered with its code
        super().log_exception(typ, value, tb)


class StatusHandler(CortexAPIHandler):
    """GET {base_url}cortex/api/status: is the backend reachable, which versions, do they match."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish((await status_report(self.connection)).model_dump_json())


class LocalBackendStartHandler(CortexAPIHandler):
    """POST {base_url}cortex/api/local/start: start the user's local backend (the sidebar's "Start local
    backend"), then answer with the status report. Only when no backend is configured."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        target = self.connection.target()
        if target.kind != SOURCE_LOCAL:
            raise ApiError(
                "conflict",
                f"this Jupyter server uses the backend at {target.description}; it starts no"
                " local backend (unset CortexServerApp.backend_url and CORTEX_URL to use one)",
            )
        await self.starter.start()
        self.finish((await status_report(self.connection)).model_dump_json())


class RecordHandler(CortexAPIHandler):
    """GET {base_url}cortex/api/record/{job_id}[?continued_in=N]: the job's cell record (record.py), for
    the panel to rewrite a cell output whose kernel can no longer reach it."""

    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        raw = self.get_query_argument("continued_in", "")
        if raw and not raw.isdigit():
            raise ApiError("invalid_request", f"continued_in must be a cell number, not {raw!r}")
        target = self.connection.target()
        if target.url is None:
            raise ApiError("backend_unavailable", f"{target.description}: no backend to draw the record from")
        token = self.connection.token(target)
        # Drawing a record uses the kernel SDK's own picture code; loaded on the first record asked for, so
        # the proxy itself starts with the contract alone.
        from .record import draw_record

        record = await asyncio.to_thread(
            draw_record, target.url, token, self.connection.verify, job_id, int(raw) if raw else None
        )
        self.finish(json.dumps(record))


class _Relay:
    """Copies the backend's response to the caller as it arrives (so long-polled logs stream through)."""

    def __init__(self, handler: ProxyHandler) -> None:
        self.handler = handler
        self.status: int | None = None
        self.headers = HTTPHeaders()
        self.started = False
        self.content_type = "application/json"

    def on_header(self, line: str) -> None:
        if line.startswith("HTTP/"):
            self.status = int(line.split(" ", 2)[1])
            self.headers = HTTPHeaders()  # a 100-continue may come first
        elif line.strip():
            self.headers.parse_line(line)
        elif self.status is not None and self.status >= 200:
            self.start()

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        handler = self.handler
        handler.set_status(self.status or 502, responses.get(self.status or 502, "Unknown"))
        for name, value in response_headers_to_forward(self.headers.get_all()):
            handler.set_header(name, value)
            if name.lower() == "content-type":
                self.content_type = value

    def on_chunk(self, chunk: bytes) -> None:
        self.start()
        try:
            self.handler.write(chunk)
            self.handler.flush()
        except StreamClosedError:
            pass  # the caller went away; the backend's answer is dropped


class ProxyHandler(CortexAPIHandler):
    """{base_url}cortex/api/version and {base_url}cortex/api/v1/...: allowlisted backend routes only.

    The caller's cookies and Authorization never reach the backend; the server adds its own Bearer
    token. The response (status, body, cortex headers) is relayed as the backend sent it.
    """

    async def forward(self) -> None:
        # The raw path (still percent-encoded), so the allowlist and the backend match the same string.
        allowed = allowlist.check(self.request.method, self.request.path[len(self.api_prefix) :])
        target = self.connection.target()
        relay = _Relay(self)
        request = self.connection.build_request(
            self.request.method,
            allowed.path,
            self.request.query,
            headers=request_headers_to_forward(self.request.headers.get_all()),
            body=self.request.body or None,
            authenticated=allowed.route.scope is not None,
            header_callback=relay.on_header,
            streaming_callback=relay.on_chunk,
            target=target,
        )
        failure: Exception | None = None
        try:
            response = await self.connection.http.fetch(request, raise_error=False)
            failure = response.error if response.code == 599 else None
        except (OSError, HTTPClientError) as exc:
            failure = exc
        if failure is not None and not relay.started:
            raise ApiError(
                "backend_unavailable",
                f"the Jupyter server could not reach the cortex-nb backend at {target.url} ({target.description}):"
                f" {type(failure).__name__}: {failure}. Is it running? See {self.base_url}cortex/api/status",
            )
        relay.start()
        self.finish(set_content_type=relay.content_type)

    @web.authenticated
    @authorized
    async def get(self, *_: str) -> None:
        await self.forward()

    @web.authenticated
    @authorized
    async def post(self, *_: str) -> None:
        await self.forward()

    @web.authenticated
    @authorized
    async def put(self, *_: str) -> None:
        await self.forward()

    @web.authenticated
    @authorized
    async def delete(self, *_: str) -> None:
        await self.forward()

    @web.authenticated
    @authorized
    async def patch(self, *_: str) -> None:
        await self.forward()
