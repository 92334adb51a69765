"""What every handler shares: route lookup, Bearer auth and scopes, body limits, JSON errors,
and replay of idempotent POSTs. Handlers stay thin: parse, authorize, call the service, render.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import tornado.web
from pydantic import BaseModel

from cortex_nb.protocol import routes
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import parse, render_bytes
from cortex_nb.protocol.versions import API_VERSION, __version__

from ..auth import API_KEY_HEADER, Principal, authenticate
from ..service import Service
from ..storage_faults import storage_api_error
from ..validation import dumps_strict, parse_json_object

log = logging.getLogger("cortex_backend.http")

IDEMPOTENCY_HEADER = "Idempotency-Key"


@tornado.web.stream_request_body
class BaseHandler(tornado.web.RequestHandler):
    """Bodies are streamed so an oversized one is answered with a clean 413, not a dropped socket."""

    service: Service
    principal: Principal | None
    route: routes.Route | None
    # The route table this handler serves (a compatibility face serves its own).
    routes_served: tuple[routes.Route, ...] = routes.ROUTES

    def initialize(self, service: Service) -> None:
        self.service = service
        self.principal = None
        self.route = None
        self._body = bytearray()
        self._body_limit = service.settings.max_body_bytes
        self._body_too_large = False
        self._received = 0
        # True once prepare() passed: Tornado then reads the whole body before the method runs.
        self._accepted = False

    def body_limit(self) -> int:
        return self.service.settings.max_body_bytes

    def prepare(self) -> None:
        self.set_header("X-Cortex-Version", __version__)
        self.set_header("X-Cortex-Api-Version", API_VERSION)
        found = routes.match(self.request.method, self.request.path, self.routes_served)
        if found is None:
            if any(re.match(route.regex, self.request.path) for route in self.routes_served):
                raise ApiError(
                    "method_not_allowed", f"{self.request.method} is not allowed on {self.request.path}"
                )
            raise ApiError(
                "route_not_found", f"no route {self.request.method} {self.request.path}; see docs/api.md"
            )
        self.route = found[0]
        if self.route.scope is not None:
            self.principal = authenticate(
                self.service.store,
                self.request.headers.get("Authorization"),
                self.request.headers.get(API_KEY_HEADER),
            )
            self.principal.require(self.route.scope)
        self._body_limit = self.body_limit()
        declared = self._declared_length()
        if declared is not None and declared > self._body_limit:
            self._body_too_large = True
        self._accepted = True

    def _declared_length(self) -> int | None:
        declared = self.request.headers.get("Content-Length")
        return int(declared) if declared is not None and declared.isascii() and declared.isdigit() else None

    def _body_left_unread(self) -> bool:
        """A refusal before the body was read leaves it on the connection, which then cannot be reused."""
        if self._accepted:
            return False
        chunked = "chunked" in self.request.headers.get("Transfer-Encoding", "").lower()
        return chunked or (self._declared_length() or 0) > self._received

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received > self._body_limit:
            # Keep reading (and dropping) so the client gets the 413 instead of a reset connection.
            self._body_too_large = True
            self._body = bytearray()
        elif not self._body_too_large:
            self._body.extend(chunk)

    @property
    def body(self) -> bytes:
        if self._body_too_large:
            raise ApiError(
                "body_too_large",
                f"the body is {self._received} bytes; the limit is {self._body_limit}. Send large frames as chunks"
                " (the client does this for you) or split the batch.",
                {"limit": self._body_limit},
            )
        return bytes(self._body)

    def json_body(self) -> dict[str, Any]:
        return parse_json_object(self.body)

    # what the route takes ------------------------------------------------------------------------
    def parse_body(self) -> Any:
        """The JSON body as the route's `Body` model, or the error naming its first bad field."""
        return parse(self.route.body, self.json_body())

    def query_args(self) -> Any:
        """The query parameters as the route's `Query` model (an empty value counts as absent)."""
        model = self.route.query
        given = self.request.query_arguments
        raw = {}
        for name in model.model_fields:
            if name in given:
                # Tornado's reading of the last value (decoded, control characters replaced, stripped).
                value = self.get_query_arguments(name)[-1]
                if value != "":
                    raw[name] = value
        return parse(model, raw)

    # idempotency -------------------------------------------------------------------------------
    # Requests with the same owner and Idempotency-Key that are being answered right now (a retry that
    # arrives before the first attempt's answer waits for it, then replays it).
    _in_flight: dict[tuple[str, str], asyncio.Event] = {}

    @contextlib.asynccontextmanager
    async def idempotency_turn(self) -> AsyncIterator[None]:
        key = self.request.headers.get(IDEMPOTENCY_HEADER)
        if not key or self.principal is None:
            yield
            return
        ident = (self.principal.owner, key)
        while (running := BaseHandler._in_flight.get(ident)) is not None:
            await running.wait()
        done = BaseHandler._in_flight[ident] = asyncio.Event()
        try:
            yield
        finally:
            del BaseHandler._in_flight[ident]
            done.set()

    def replay_if_seen(self) -> bool:
        """If this Idempotency-Key was answered before, answer the same again and return True."""
        key = self.request.headers.get(IDEMPOTENCY_HEADER)
        if not key or self.principal is None:
            return False
        seen = self.service.store.idempotent_response(self.principal.owner, key)
        if seen is None:
            return False
        if seen["body_sha256"] != self._body_sha256():
            raise ApiError(
                "idempotency_key_reused", f"Idempotency-Key {key!r} was used before with a different body"
            )
        self.set_header("Idempotent-Replay", "true")
        self.write_json(seen["response"], seen["status"])
        return True

    def remember(self, status: int, response: Any) -> None:
        key = self.request.headers.get(IDEMPOTENCY_HEADER)
        if key and self.principal is not None:
            self.service.store.remember_response(
                self.principal.owner, key, self._body_sha256(), status, response
            )

    def _body_sha256(self) -> str:
        return hashlib.sha256(
            self.route.name.encode() + b"\0" + self.request.path.encode() + b"\0" + bytes(self._body)
        ).hexdigest()

    # rendering ---------------------------------------------------------------------------------
    def write_json(self, value: Any, status: int = 200) -> None:
        """Render `value` as the route's reply model: exactly the fields its schema declares."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        reply = getattr(self.route, "reply", None)
        if isinstance(reply, type) and issubclass(reply, BaseModel):
            self.finish(render_bytes(reply, value, strict=self.service.settings.strict_replies))
        else:
            self.finish(dumps_strict(value))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        refused = storage_api_error(exc) if exc is not None and not isinstance(exc, ApiError) else None
        if refused is not None:
            # The disk is full or another process holds the database lock: the client can act or retry.
            exc = refused
            if exc.status == 503:
                self.set_header("Retry-After", "1")
        if isinstance(exc, ApiError):
            code, message, detail, status = exc.code, exc.message, exc.detail, exc.status
        elif isinstance(exc, tornado.web.HTTPError):
            status = exc.status_code
            code = {
                400: "invalid_request",
                404: "route_not_found",
                405: "method_not_allowed",
                413: "body_too_large",
            }.get(status, "internal_error")
            message, detail = exc.log_message or self._reason, {}
        else:
            status, code, message, detail = (
                500,
                "internal_error",
                "the backend hit an unexpected error; it is logged",
                {},
            )
        self.clear_header("Idempotent-Replay")
        if self._body_left_unread():
            # Tornado drops the connection after this answer; say so, or the client's next request on it fails.
            self.set_header("Connection", "close")
        self.set_status(self.error_status(code, status), reason=self.error_reason(code, message))
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(dumps_strict({"error": {"code": code, "message": message, "detail": detail}}))

    def error_status(self, code: str, status: int) -> int:
        """The HTTP status an error code answers with (a compatibility face maps codes for its own clients)."""
        return status

    def error_reason(self, code: str, message: str) -> str | None:
        """The HTTP reason phrase of an error answer; None: the status's usual one."""
        return None

    # observability ------------------------------------------------------------------------------
    # Set by handlers that hold a request open (long-poll, log stream): their time is waiting, not work.
    waited = False
    # How the request counters name an answer no route of the table matched.
    unmatched_name = "unmatched"

    def on_finish(self) -> None:
        metrics = getattr(self.service, "operator_metrics", None)
        if metrics is None:
            return
        waited = self.waited or (
            "wait" in self.request.query_arguments
            and self.get_query_argument("wait", "") not in ("", "0", "0.0")
        )
        name = self.route.name if self.route is not None else self.unmatched_name
        metrics.observe_request(
            name, self.request.method, self.get_status(), self.request.request_time(), waited
        )

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, ApiError):
            return  # an expected refusal, answered with its code
        if storage_api_error(value) is not None:
            log.warning("%s %s: the store refused a write: %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)


class NotFoundHandler(BaseHandler):
    """Every path no route serves: a JSON 404 (or 405), never Tornado's HTML page."""

    def get(self, *args: Any) -> None:  # prepare() raises before this runs
        raise ApiError("route_not_found", f"no route {self.request.path}")

    post = put = delete = patch = get
