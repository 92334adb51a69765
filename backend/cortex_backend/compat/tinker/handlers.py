"""Tornado handlers for the Tinker routes: parse, authorize (the key arrives as X-API-Key), call the face,
render. Errors keep our JSON shape, with statuses chosen so the SDK never retries a refusal: it retries
408, 409, 429 and 5xx for minutes, so a conflict answers 400 here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tornado.web
import zstandard

from cortex_nb.protocol.errors import ApiError

from ...handlers.base import BaseHandler
from ...service import Service
from ..query import clamped_int
from . import listings, messages, results, sampling
from .face import TinkerFace
from .routes import ROUTES

# Server flags for the SDK (tinker.types.ClientConfigResponse): API keys (no JWT exchange), fwd/bwd bodies
# uncompressed, custom losses and sampling futures the per-request way, and httpx's own transport, which trusts
# SSL_CERT_FILE (a backend's self-signed certificate); the SDK's default transport reads only the system store.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": True,
    "custom_loss_server_side": False,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "use_pyqwest_transport": False,
}
DYNAMIC_CONFIG = {"refresh_interval_sec": 300, "sample_cancel_enabled": True}


class TinkerHandler(BaseHandler):
    routes_served = ROUTES
    face: TinkerFace

    def initialize(self, service: Service, face: TinkerFace) -> None:  # type: ignore[override]
        super().initialize(service)
        self.face = face

    def prepare(self) -> None:
        super().prepare()
        # Sessions exist only once a call made one, so the face's sweep for expired sessions starts with the first.
        self.face.start()

    def error_status(self, code: str, status: int) -> int:
        return 400 if status == 409 else status

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Refusals are final: tell the SDK's HTTP layer not to retry them on its own.
        self.set_header("x-should-retry", "false")
        super().write_error(status_code, **kwargs)


JsonOperation = Callable[[TinkerFace, Any, dict[str, Any]], Any]

OPERATIONS: dict[str, JsonOperation] = {
    "create_session": lambda face, who, body: face.create_session(who, body),
    "session_heartbeat": lambda face, who, body: face.heartbeat(who, body.get("session_id")),
    "create_model": lambda face, who, body: face.create_model(who, body),
    "get_info": lambda face, who, body: face.get_info(who, body.get("model_id")),
    "optim_step": lambda face, who, body: face.optim_step(who, body),
    "save_weights": lambda face, who, body: face.save_state(who, body),
    "save_weights_for_sampler": lambda face, who, body: face.save_for_sampler(who, body),
    "load_weights": lambda face, who, body: face.load_weights(who, body),
    "create_sampling_session": lambda face, who, body: sampling.create_sampling_session(face, who, body),
    "asample": lambda face, who, body: sampling.sample(face, who, body),
    "cancel_future": lambda face, who, body: face.cancel(who, body),
    "weights_info": lambda face, who, body: listings.weights_info(face, who, body.get("tinker_path")),
    "client_config": lambda face, who, body: CLIENT_CONFIG,
    "client_dynamic_config": lambda face, who, body: DYNAMIC_CONFIG,
}


class OperationHandler(TinkerHandler):
    """POST routes with a JSON body and a JSON answer; the route's name picks the operation."""

    def post(self, **path: str) -> None:
        self.write_json(OPERATIONS[operation(self)](self.face, self.principal, self.json_body()))


class ForwardBackwardHandler(TinkerHandler):
    """The one body the SDK sends as protobuf (optionally zstd-compressed)."""

    async def post(self) -> None:
        body = self.body
        if not self.request.headers.get("Content-Type", "").startswith(messages.CONTENT_TYPE):
            raise ApiError(
                "invalid_request",
                f"forward_backward takes a {messages.CONTENT_TYPE} body (tinker SDK 0.38 or later)",
            )
        if self.request.headers.get("Content-Encoding", "") == "zstd":
            body = decompress(body, self.service.settings.max_body_bytes)
        self.write_json(
            await self.face.forward_backward(self.principal, messages.decode_forward_backward(body))
        )


def decompress(body: bytes, limit: int) -> bytes:
    """A zstd body, decompressed to no more than an uncompressed body may hold (a frame that declares a larger
    size is refused before anything is allocated)."""
    try:
        declared = zstandard.frame_content_size(body)
        if declared > limit:
            raise ApiError(
                "body_too_large",
                f"the zstd body holds {declared} bytes; the limit is {limit}",
                {"limit": limit},
            )
        data = zstandard.ZstdDecompressor().decompress(body, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise ApiError("invalid_request", f"the zstd body could not be decompressed: {exc}") from None
    if len(data) > limit:
        raise ApiError("body_too_large", f"the zstd body holds more than {limit} bytes", {"limit": limit})
    return data


class RetrieveFutureHandler(TinkerHandler):
    async def post(self) -> None:
        self.waited = True
        kind, answer = await results.retrieve(self.face, self.principal, self.json_body().get("request_id"))
        if kind == "proto":
            self.set_header("Content-Type", messages.CONTENT_TYPE)
            self.finish(answer)
        else:
            self.write_json(answer)


class FinishSessionHandler(TinkerHandler):
    def post(self, session_id: str) -> None:
        self.face.finish(self.principal, session_id, self.json_body())
        self.write_json(None)


class TelemetryHandler(TinkerHandler):
    """The SDK's telemetry: accepted and dropped, unread."""

    def post(self) -> None:
        self.write_json({"status": "accepted"})


class HealthHandler(TinkerHandler):
    def get(self) -> None:
        self.write_json({"status": "ok"})


class ReadHandler(TinkerHandler):
    """GET routes that read: capabilities, sessions, samplers, training runs, checkpoints."""

    def get(self, **path: str) -> None:
        name, who, face = operation(self), self.principal, self.face
        if name == "get_server_capabilities":
            answer = listings.capabilities(face)
        elif name == "get_session":
            answer = listings.session(face, who, path["session_id"])
        elif name == "list_sessions":
            answer = listings.sessions(face, who)
        elif name == "get_sampler":
            answer = listings.sampler(face, who, path["sampler_id"])
        elif name == "get_training_run":
            answer = listings.training_run(face, who, path["training_run_id"])
        elif name == "list_checkpoints":
            answer = listings.checkpoints(face, who, path["training_run_id"])
        else:
            limit, offset = clamped_int(self, "limit", 20, 1, 1000), clamped_int(self, "offset", 0)
            listing = listings.training_runs if name == "list_training_runs" else listings.user_checkpoints
            answer = listing(face, who, limit, offset)
        self.write_json(answer)


class DeleteCheckpointHandler(TinkerHandler):
    def delete(self, training_run_id: str, kind: str, name: str) -> None:
        listings.delete_checkpoint(self.face, self.principal, training_run_id, kind, name)
        self.write_json(None)


class UnsupportedHandler(TinkerHandler):
    def post(self) -> None:
        raise ApiError(
            "unsupported_operation", f"{operation(self)} is not offered by this backend (see docs/tinker.md)"
        )


def operation(handler: TinkerHandler) -> str:
    return handler.route.name.removeprefix("tinker:")


HANDLERS: dict[str, type[TinkerHandler]] = {
    **{name: OperationHandler for name in OPERATIONS},
    "healthz": HealthHandler,
    "telemetry": TelemetryHandler,
    "forward_backward": ForwardBackwardHandler,
    "retrieve_future": RetrieveFutureHandler,
    "finish_session": FinishSessionHandler,
    "delete_checkpoint": DeleteCheckpointHandler,
    **{
        name: ReadHandler
        for name in (
            "get_server_capabilities",
            "get_session",
            "list_sessions",
            "get_sampler",
            "list_training_runs",
            "get_training_run",
            "list_checkpoints",
            "list_user_checkpoints",
        )
    },
    **{name: UnsupportedHandler for name in ("save_weights_external", "create_custom_loss", "copy_weights")},
}


def handler_specs(service: Service, face: TinkerFace) -> list[tornado.web.URLSpec]:
    return [
        tornado.web.url(
            route.regex, HANDLERS[route.name.removeprefix("tinker:")], {"service": service, "face": face}
        )
        for route in ROUTES
    ]
