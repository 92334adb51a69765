"""Tornado handlers for the Tinker routes: parse, authorize (the key arrives as X-API-Key), call the face,
render. Errors keep our JSON shape, with statuses chosen so the SDK never retries a refusal: it retries
408, 409, 429 and 5xx for minutes, so a conflict answers 400 here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import tornado.web

from cortex_nb.protocol.errors import ApiError

from ...checkpoints import CheckpointManager
from ...service import Service
from ..face import FaceHandler, face_url_specs
from ..face_errors import tinker_status
from ..query import clamped_int
from . import downloads, listings, messages, results, sampling, search, traces
from .face import TinkerFace
from .routes import ROUTES

# Server flags for the SDK (tinker.types.ClientConfigResponse): API keys (no JWT exchange), fwd/bwd bodies
# uncompressed, custom losses uploaded and run on the trainer, sampling futures the per-request way, and httpx's own transport, which trusts
# SSL_CERT_FILE (a backend's self-signed certificate); the SDK's default transport reads only the system store.
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": True,
    "custom_loss_server_side": True,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "use_pyqwest_transport": False,
}
DYNAMIC_CONFIG = {"refresh_interval_sec": 300, "sample_cancel_enabled": True}


class TinkerHandler(FaceHandler):
    """A Tinker route (routes.py): our auth, scopes and errors, with statuses the SDK never retries on its own
    for a final refusal (compat/face.py is the template)."""

    routes_served = ROUTES
    face: TinkerFace
    sdk_status = staticmethod(tinker_status)

    def prepare(self) -> None:
        super().prepare()
        # Sessions exist only once a call made one, so the face's sweep for expired sessions starts with the first.
        self.face.start()

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
    "save_weights_external": lambda face, who, body: face.save_external(who, body),
    "load_weights": lambda face, who, body: face.load_weights(who, body),
    "create_sampling_session": lambda face, who, body: sampling.create_sampling_session(face, who, body),
    "asample": lambda face, who, body: sampling.sample(face, who, body),
    "cancel_future": lambda face, who, body: face.cancel(who, body),
    "weights_info": lambda face, who, body: listings.weights_info(face, who, body.get("tinker_path")),
    "search_sessions": lambda face, who, body: search.search_sessions(face, who, body),
    "create_custom_loss": lambda face, who, body: face.create_custom_loss(who, body),
    "client_config": lambda face, who, body: CLIENT_CONFIG,
    "client_dynamic_config": lambda face, who, body: DYNAMIC_CONFIG,
}


# Operations on a training client that carry its seq_id: a refusal of any of them must use its number up.
NUMBERED_OPERATIONS = frozenset(
    {"optim_step", "save_weights", "save_weights_for_sampler", "save_weights_external", "load_weights"}
)


class OperationHandler(TinkerHandler):
    """POST routes with a JSON body and a JSON answer; the route's name picks the operation."""

    def post(self, **path: str) -> None:
        name, body = operation(self), self.json_body()
        numbered = name in NUMBERED_OPERATIONS
        with (
            self.face.numbered_refusals(self.principal, body.get("model_id"), body.get("seq_id"))
            if numbered
            else contextlib.nullcontext()
        ):
            self.write_json(OPERATIONS[name](self.face, self.principal, body))


class ForwardBackwardHandler(TinkerHandler):
    """The one body the SDK sends as protobuf (optionally zstd-compressed)."""

    async def post(self) -> None:
        if not self.request.headers.get("Content-Type", "").startswith(messages.CONTENT_TYPE):
            raise ApiError(
                "invalid_request",
                f"forward_backward takes a {messages.CONTENT_TYPE} body (tinker SDK 0.38 or later)",
            )
        compressed = self.request.headers.get("Content-Encoding", "") == "zstd"
        request = await self.face.decoder.forward_backward(self.principal.owner, self.body, compressed)
        with self.face.numbered_refusals(self.principal, request.model_id, request.seq_id):
            self.write_json(await self.face.forward_backward(self.principal, request))


class RetrieveFutureHandler(TinkerHandler):
    async def post(self) -> None:
        self.waited = True
        kind, answer = await results.retrieve(self.face, self.principal, self.json_body().get("request_id"))
        if kind == "proto":
            self.set_header("Content-Type", messages.CONTENT_TYPE)
            self.finish(answer)
        else:
            self.write_json(answer)


class CopyWeightsHandler(TinkerHandler):
    def post(self) -> None:
        key = self.request.headers.get("X-Idempotency-Key")
        self.write_json(self.face.copy_weights(self.principal, self.json_body(), key))


class FinishSessionHandler(TinkerHandler):
    def post(self, session_id: str) -> None:
        self.face.finish(self.principal, session_id, self.json_body())
        self.write_json(None)


class AssignProjectHandler(TinkerHandler):
    def put(self, session_id: str) -> None:
        self.face.assign_project(self.principal, session_id, self.json_body())
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
        elif name == "get_checkpoint_storage_usage":
            answer = listings.storage_usage(face, who)
        elif name == "export_session_trace":
            base_url = f"{self.request.protocol}://{self.request.host}"
            answer = traces.export_url(face, who, base_url, path["session_id"])
        elif name == "get_external_weights_urls":
            base_url = f"{self.request.protocol}://{self.request.host}"
            answer = downloads.signed_urls(
                face, who, base_url, path["training_run_id"], path["kind"], path["name"]
            )
        else:
            limit, offset = clamped_int(self, "limit", 20, 1, 1000), clamped_int(self, "offset", 0)
            listing = listings.training_runs if name == "list_training_runs" else listings.user_checkpoints
            answer = listing(face, who, limit, offset)
        self.write_json(answer)


class DeleteCheckpointHandler(TinkerHandler):
    def delete(self, training_run_id: str, kind: str, name: str) -> None:
        listings.delete_checkpoint(self.face, self.principal, training_run_id, kind, name)
        self.write_json(None)


class ExternalWeightsFileHandler(TinkerHandler):
    """One file of an external-weights checkpoint, by a signed URL (no key: the signature is the credential).
    Every file is checked against its SHA-256 before the first byte, which `X-Checksum-SHA256` also carries;
    `Range: bytes=N-` resumes an interrupted download."""

    async def get(self, job_id: str, checkpoint_id: str, file_name: str) -> None:
        held = downloads.open_signed(
            self.face, job_id, checkpoint_id, file_name, self.request.query_arguments
        )
        try:
            await asyncio.get_running_loop().run_in_executor(None, CheckpointManager.verify_files, held.plan)
            _, file_path, size = held.plan.files[0]
            start = downloads.range_start(self.request.headers.get("Range"), size)
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Accept-Ranges", "bytes")
            self.set_header("X-Checksum-SHA256", held.sha256)
            self.set_header("Content-Length", str(size - start))
            if start:
                self.set_status(206)
                self.set_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            with open(file_path, "rb") as handle:
                handle.seek(start)
                while block := await asyncio.get_running_loop().run_in_executor(None, handle.read, 1 << 20):
                    self.write(block)
                    await self.flush()
        finally:
            self.face.service.checkpoints.end_export(held.plan)
        self.finish()


class SessionTraceHandler(TinkerHandler):
    """A session's Chrome trace, by the signed URL export_session_trace gave (no key)."""

    def get(self, session_id: str) -> None:
        self.write_json(traces.signed_trace(self.face, session_id, self.request.query_arguments))


class CheckpointLifecycleHandler(TinkerHandler):
    """Publish (POST .../publish), unpublish (DELETE .../publish), set or clear the TTL (PUT .../ttl)."""

    def post(self, training_run_id: str, kind: str, name: str) -> None:
        listings.set_public(self.face, self.principal, training_run_id, kind, name, True)
        self.write_json(None)

    def delete(self, training_run_id: str, kind: str, name: str) -> None:
        listings.set_public(self.face, self.principal, training_run_id, kind, name, False)
        self.write_json(None)

    def put(self, training_run_id: str, kind: str, name: str) -> None:
        ttl = self.json_body().get("ttl_seconds")
        listings.set_ttl(self.face, self.principal, training_run_id, kind, name, ttl)
        self.write_json(None)


# SDK calls this backend does not serve, each refused at once (400, never retried) with its reason.
REFUSED: dict[str, str] = {
    "get_billing_usage": "there is no billing here",
    "get_audit_log": "there is no audit log here; GET /v1/events lists job state changes",
    "auth_token": "keys are tokens of this backend; there is no JWT exchange",
}


class UnsupportedHandler(TinkerHandler):
    def _refuse(self, **path: str) -> None:
        name = operation(self)
        why = REFUSED.get(name, "see docs/tinker.md")
        raise ApiError("unsupported_operation", f"{name} is not offered by this backend: {why}")

    get = post = put = delete = _refuse


def operation(handler: TinkerHandler) -> str:
    return handler.route.name.removeprefix("tinker:")


HANDLERS: dict[str, type[TinkerHandler]] = {
    **{name: OperationHandler for name in OPERATIONS},
    "healthz": HealthHandler,
    "telemetry": TelemetryHandler,
    "forward_backward": ForwardBackwardHandler,
    "retrieve_future": RetrieveFutureHandler,
    "finish_session": FinishSessionHandler,
    "assign_session_project": AssignProjectHandler,
    "copy_weights": CopyWeightsHandler,
    "delete_checkpoint": DeleteCheckpointHandler,
    "external_weights_file": ExternalWeightsFileHandler,
    "session_trace_file": SessionTraceHandler,
    "publish_checkpoint": CheckpointLifecycleHandler,
    "unpublish_checkpoint": CheckpointLifecycleHandler,
    "set_checkpoint_ttl": CheckpointLifecycleHandler,
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
            "get_checkpoint_storage_usage",
            "get_external_weights_urls",
            "export_session_trace",
        )
    },
    **{name: UnsupportedHandler for name in REFUSED},
}


def handler_specs(service: Service, face: TinkerFace) -> list[tornado.web.URLSpec]:
    return face_url_specs(
        ROUTES, {f"tinker:{name}": handler for name, handler in HANDLERS.items()}, service, face
    )
