"""The Tinker API's operations, each translated into the service calls our own handlers make.

A training client is a job with one training sub-job; forward_backward, optim_step and the saves are ordinary
requests on it, numbered by the SDK's seq_id (so retries run once and parallel chunks run in order); a
sampling client samples a checkpoint (or the base model) through `generate` with saved weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from cortex_nb.protocol import states
from cortex_nb.protocol.custom_loss import CUSTOM_LOSS, validate_custom_loss
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.base import parse
from cortex_nb.protocol.schemas.jobs import CreateJob

from ...auth import Principal
from ...checkpoint_copies import copy_checkpoint
from ...checkpoints import RESUMABLE, WEIGHTS_ONLY
from ...service import Service
from . import names, translate
from .decoding import Decoder
from .futures import Future, Futures
from .messages import ForwardBackwardRequest
from .samplers import SamplerHosts
from .sessions import SamplingSession, Session, Sessions, project_id

log = logging.getLogger("cortex_backend.tinker")

# The stream name of a training client's numbered requests (RequestManager sequences).
STREAM = "tinker"
SWEEP_S = 1.0
COPIES_REMEMBERED = 1024
MAX_CUSTOM_LOSSES = 64  # per session
# What a new model's optimizer starts as (Tinker's AdamParams defaults); every optim_step sends its own.
ADAM_DEFAULTS = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-12, "weight_decay": 0.0}


def integer_field(body: dict[str, Any], key: str, low: int = 0) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(
            "invalid_field", f"{key}: must be an integer of at least {low}, got {value!r}", {"field": key}
        )
    return value


def untyped_future(future: Future, **extra: Any) -> dict[str, Any]:
    return {"request_id": future.id, **extra}


class TinkerFace:
    def __init__(self, service: Service, session_timeout_s: float) -> None:
        self.service = service
        self.sessions = Sessions(session_timeout_s, self.expire_session)
        self.futures = Futures()
        self.hosts = SamplerHosts(service)
        self.decoder = Decoder(service.settings.max_body_bytes)
        self._sweeper: asyncio.Task | None = None
        # (owner, X-Idempotency-Key) -> the tinker path a copy_weights made: a retried copy makes no second one.
        self._copies: OrderedDict[tuple[str, str], str] = OrderedDict()
        # A live sampling client's checkpoint is in use: expiry waits until its session ends.
        service.checkpoint_expiry.holders.append(self.sessions.sampled_checkpoints)

    # lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sweep for sessions whose heartbeats stopped (once; on the IO loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            for session in self.sessions.expired():
                try:
                    self.expire_session(session)
                except Exception:
                    log.exception("ending expired session %s failed", session.id)

    def expire_session(self, session: Session) -> None:
        self.end_session(session, f"expired: no heartbeat for {self.sessions.timeout_s:g} s")

    def end_session(self, session: Session, reason: str) -> None:
        """Complete the session's jobs (queued requests still run) and delete its ephemeral sampler checkpoints."""
        log.info("tinker session %s ended: %s", session.id, reason)
        self.sessions.end(session, reason)
        for job_id in session.models.values():
            with contextlib.suppress(ApiError):
                self.service.completion.complete(session.principal, job_id)
        for sampler_id in session.samplers.values():
            sampler = self.sessions.sampling.get(sampler_id)
            if sampler is not None and sampler.ephemeral and sampler.checkpoint is not None:
                with contextlib.suppress(ApiError):
                    job = self.service.jobs.visible_job(session.principal, sampler.checkpoint[0])
                    self.service.checkpoints.delete(session.principal, job, sampler.checkpoint[1])

    # sessions -----------------------------------------------------------------------------------
    def create_session(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.create(principal, body)
        return {"type": "create_session", "session_id": session.id}

    def heartbeat(self, principal: Principal, session_id: Any) -> dict[str, Any]:
        session = self.sessions.live(principal, session_id)
        for job_id in session.models.values():
            self.service.store.touch_job(job_id)
        return {"type": "session_heartbeat"}

    def finish(self, principal: Principal, session_id: str, body: dict[str, Any]) -> None:
        session = self.sessions.find(principal, session_id)
        if session.ended is None:
            reason = (
                (body.get("reason") or {}).get("type", "success")
                if isinstance(body.get("reason"), dict)
                else "success"
            )
            self.end_session(session, f"finished: {reason}")

    def assign_project(self, principal: Principal, session_id: str, body: dict[str, Any]) -> None:
        """`assign_session_project`: the session's project becomes the one named (a label of its owner's)."""
        session = self.sessions.find(principal, session_id)
        session.project_id = project_id(body.get("project_id"))

    # custom losses --------------------------------------------------------------------------------
    def create_custom_loss(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """Check a traced loss against the allow-list (cortex_nb/protocol/custom_loss.py) and keep it with its
        session; a retried custom_loss_seq_id answers with the same loss."""
        session = self.sessions.live(principal, body.get("session_id"))
        seq = integer_field(body, "custom_loss_seq_id")
        if seq not in session.custom_loss_ids:
            loss = validate_custom_loss(body.get("name"), body.get("inputs"), body.get("graph"))
            if len(session.custom_losses) >= MAX_CUSTOM_LOSSES:
                raise ApiError(
                    "invalid_field",
                    f"custom_loss_seq_id: a session keeps at most {MAX_CUSTOM_LOSSES} custom losses",
                    {"field": "custom_loss_seq_id"},
                )
            loss_id = f"{session.id}:loss:{seq}"
            session.custom_loss_ids[seq] = loss_id
            session.custom_losses[loss_id] = loss
        loss_id = session.custom_loss_ids[seq]
        future = self.futures.known(f"loss.{loss_id}") or self.futures.add(
            Future(f"loss.{loss_id}", principal.owner, "create_custom_loss", "", render={"loss_id": loss_id})
        )
        return untyped_future(future)

    def custom_loss_of(self, job_id: str, config: dict[str, Any]) -> dict[str, Any]:
        """The validated loss a forward_backward names by `loss_fn_config.loss_id`: one of its model's session."""
        loss_id = config.get("loss_id")
        session = self.sessions.of_model(job_id)
        loss = (
            session.custom_losses.get(loss_id) if session is not None and isinstance(loss_id, str) else None
        )
        if loss is None:
            raise ApiError(
                "invalid_field",
                f"loss_fn_config.loss_id: {str(loss_id)[:80]!r} names no custom loss of this model's session;"
                " create it with ServiceClient.create_custom_loss in the same session",
                {"field": "loss_fn_config.loss_id"},
            )
        return loss

    # models -------------------------------------------------------------------------------------
    def model_job(self, principal: Principal, model_id: Any) -> dict[str, Any]:
        """The job behind a model id, visible to this principal, whose session (if any) is still live."""
        if not isinstance(model_id, str) or not model_id:
            raise ApiError("invalid_field", "model_id: required", {"field": "model_id"})
        try:
            job = self.service.jobs.visible_job(principal, names.job_id_for(model_id))
        except ApiError as exc:
            raise ApiError(
                "model_not_found", f"no model {model_id!r} is visible to this key; create a training client"
            ) from exc
        session = self.sessions.of_model(job["id"])
        if session is not None:
            self.sessions.live(principal, session.id)
        return job

    def _create_job(
        self,
        principal: Principal,
        session: Session,
        seq: int,
        base_model: str,
        lora: dict[str, Any],
        seed: int | None = None,
    ) -> str:
        model_id = names.model_id(session.id, seq)
        spec = {
            "job_id": names.job_id_for(model_id),
            "name": f"tinker {base_model} r={lora.get('r')}",
            "experiment": session.display_name or session.id,
            "labels": {"api": "tinker", "tinker.model_id": model_id, "tinker.session": session.id},
            "sub_jobs": [
                {
                    "type": states.TRAINING,
                    "base_model": base_model,
                    "lora": lora,
                    "optimizer": dict(ADAM_DEFAULTS),
                    "seed": secrets.randbelow(2**31) if seed is None else seed,
                }
            ],
        }
        return self.service.jobs.create(principal, parse(CreateJob, spec))["id"]

    def create_model(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions.live(principal, body.get("session_id"))
        seq = integer_field(body, "model_seq_id")
        model_id = names.model_id(session.id, seq)
        if seq in session.models:
            return untyped_future(
                self.futures.get(principal, f"create.{session.models[seq]}"), model_id=model_id
            )
        optimizer = body.get("optimizer_config") or {}
        if isinstance(optimizer, dict) and optimizer.get("type", "adamw") != "adamw":
            raise ApiError(
                "unsupported_operation",
                f"optimizer {optimizer.get('type')!r} is not supported; this backend trains with Adam(W)",
                {"field": "optimizer_config"},
            )
        self.sessions.check_room(session)
        info = self.service.catalog.get(body.get("base_model"))
        lora = translate.lora_spec(body.get("lora_config"), str(info.config.get("model_type", "")))
        job_id = self._create_job(
            principal, session, seq, info.name, lora, (body.get("lora_config") or {}).get("seed")
        )
        session.models[seq] = job_id
        future = self.futures.add(
            Future(f"create.{job_id}", principal.owner, "create_model", job_id, render={"model_id": model_id})
        )
        return untyped_future(future, model_id=model_id)

    def get_info(self, principal: Principal, model_id: Any) -> dict[str, Any]:
        job = self.model_job(principal, model_id)
        sub = job["sub_jobs"][0]["spec"]
        info = self.service.catalog.get(sub["base_model"])
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {
                "arch": (info.config.get("architectures") or [info.config.get("model_type")])[0],
                "model_name": info.name,
                "tokenizer_id": None if info.kind == "builtin" else info.name,
            },
            "is_lora": True,
            "lora_rank": (sub.get("lora") or {}).get("r"),
            "model_name": info.name,
        }

    # training -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def numbered_refusals(self, principal: Principal, model_id: Any, seq: Any) -> Iterator[None]:
        """Any refusal of a numbered request (`model_id` + `seq_id`), wherever in its handling it happens, uses
        up its number: otherwise every later request of that training client waits for it forever."""
        try:
            yield
        except ApiError as exc:
            if isinstance(model_id, str) and isinstance(seq, int) and not isinstance(seq, bool):
                with contextlib.suppress(ApiError):
                    job = self.service.jobs.visible_job(principal, names.job_id_for(model_id))
                    self.service.requests.refuse(principal, job["id"], (STREAM, seq), exc)
            raise

    def _numbered(
        self, principal: Principal, job: dict[str, Any], seq: Any, op: str, translate_request
    ) -> dict[str, Any]:
        """Submit a numbered request: a seq_id seen before answers with its request; a refusal uses the number up."""
        sequence, done, body, json_body = self._translated(principal, job, seq, translate_request)
        return done or self.service.requests.submit(principal, job["id"], op, body, json_body, None, sequence)

    async def _numbered_async(
        self, principal: Principal, job: dict[str, Any], seq: Any, op: str, translate_request
    ) -> dict[str, Any]:
        """`_numbered` for a frame: its checks run off the IO loop when it is large (RequestManager.submit_async)."""
        sequence, done, body, json_body = self._translated(principal, job, seq, translate_request)
        return done or await self.service.requests.submit_async(
            principal, job["id"], op, body, json_body, None, sequence
        )

    def _translated(
        self, principal: Principal, job: dict[str, Any], seq: Any, translate_request
    ) -> tuple[Any, ...]:
        """(sequence, the request a retry already made or None, body, json body)."""
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ApiError("invalid_field", f"seq_id: must be an integer, got {seq!r}", {"field": "seq_id"})
        sequence = (STREAM, seq)
        done = self.service.requests.sequenced(job["id"], sequence)
        if done is not None:
            return sequence, done, b"", None
        try:
            body, json_body = translate_request()
        except ApiError as exc:
            self.service.requests.refuse(principal, job["id"], sequence, exc)
            raise
        return sequence, None, body, json_body

    def future_for(
        self, principal: Principal, kind: str, job_id: str, request: dict[str, Any], **render: Any
    ) -> Future:
        return self.futures.known(request["id"]) or self.futures.add(
            Future(request["id"], principal.owner, kind, job_id, request["id"], render)
        )

    async def forward_backward(self, principal: Principal, request: ForwardBackwardRequest) -> dict[str, Any]:
        job = self.model_job(principal, request.model_id)
        lengths: list[int] = []
        widths: list[int] = []

        def frame() -> tuple[bytes, None]:
            custom = (
                self.custom_loss_of(job["id"], request.loss_fn_config)
                if request.loss_fn == CUSTOM_LOSS
                else None
            )
            body, found, found_widths = translate.datums_to_frame(
                request.data, request.loss_fn, request.loss_fn_config, {}, custom
            )
            lengths.extend(found)
            widths.extend(found_widths)
            return body, None

        op = "forward" if request.forward_only else "forward_backward"
        submitted = await self._numbered_async(principal, job, request.seq_id, op, frame)
        future = self.future_for(
            principal,
            op,
            job["id"],
            submitted,
            lengths=np.asarray(lengths, np.int32),
            widths=np.asarray(widths, np.int32),
        )
        return untyped_future(future, model_id=request.model_id)

    def optim_step(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        job = self.model_job(principal, body.get("model_id"))

        def step() -> tuple[bytes, dict[str, Any]]:
            if body.get("optimizer_params") is not None:
                raise ApiError(
                    "unsupported_operation",
                    "optimizer_params: only Adam (adam_params) is supported",
                    {"field": "optimizer_params"},
                )
            return b"", translate.step_body(body.get("adam_params", body.get("optim_params")))

        submitted = self._numbered(principal, job, body.get("seq_id"), "step", step)
        return untyped_future(
            self.future_for(principal, "optim_step", job["id"], submitted), model_id=body["model_id"]
        )

    def save_state(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        job = self.model_job(principal, body.get("model_id"))

        def save() -> tuple[bytes, dict[str, Any]]:
            name = (
                names.checkpoint_name(body["path"])
                if body.get("path") is not None
                else f"state-{body.get('seq_id')}"
            )
            ttl = self.service.checkpoints.validate_ttl(body.get("ttl_seconds"))
            if body.get("overwrite") and self.service.store.get_checkpoint(job["id"], name) is not None:
                self.service.checkpoints.delete(principal, job, name)
            return b"", {"checkpoint_id": name, "type": RESUMABLE, "ttl_seconds": ttl}

        submitted = self._numbered(principal, job, body.get("seq_id"), "save", save)
        return untyped_future(
            self.future_for(principal, "save_state", job["id"], submitted), model_id=body["model_id"]
        )

    def save_external(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """`save_weights_external`: a weights-only checkpoint `external.<name>`, whose files
        `get_external_weights_urls` hands out as signed download URLs (downloads.py)."""
        job = self.model_job(principal, body.get("model_id"))

        def save() -> tuple[bytes, dict[str, Any]]:
            if body.get("age_encryption_recipients"):
                raise ApiError(
                    "unsupported_operation",
                    "age_encryption_recipients: exported files are not encrypted by this backend; download them"
                    " over TLS and encrypt them yourself",
                    {"field": "age_encryption_recipients"},
                )
            return b"", {
                "checkpoint_id": names.EXTERNAL_PREFIX + names.checkpoint_name(body.get("path")),
                "type": WEIGHTS_ONLY,
                "ttl_seconds": self.service.checkpoints.validate_ttl(body.get("ttl_seconds")),
            }

        submitted = self._numbered(principal, job, body.get("seq_id"), "save", save)
        return untyped_future(
            self.future_for(principal, "save_external", job["id"], submitted), model_id=body["model_id"]
        )

    def copy_weights(
        self, principal: Principal, body: dict[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        """A copy of a checkpoint this key may read (its own or a published one) in a new training run of this key
        that cannot be trained on (checkpoint_copies.py); with session_id + model_seq_id, that session's run.
        There are no projects here: `destination_project_id` names none and is not kept."""
        remembered = (principal.owner, idempotency_key)
        if idempotency_key and remembered in self._copies:
            return {"tinker_path": self._copies[remembered]}
        source_job, checkpoint_id, _ = names.parse_path(body.get("source_path"))
        source = self.service.checkpoints.find(
            principal, principal.owner, source_job, checkpoint_id, reading=True
        )
        session, seq, job_id = None, None, None
        if body.get("session_id") is not None:
            session = self.sessions.live(principal, body["session_id"])
            seq = integer_field(body, "model_seq_id")
            if seq in session.models:
                raise ApiError(
                    "invalid_field",
                    f"model_seq_id: session {session.id} has a training run {seq} already",
                    {"field": "model_seq_id"},
                )
            self.sessions.check_room(session)
            job_id = names.job_id_for(names.model_id(session.id, seq))
        copied = copy_checkpoint(
            self.service.store, self.service.checkpoints, principal, source, body.get("ttl_seconds"), job_id
        )
        if session is not None:
            session.models[seq] = copied["job_id"]
        path = names.tinker_path(copied["job_id"], copied["checkpoint_id"])
        if idempotency_key:
            self._copies[remembered] = path
            while len(self._copies) > COPIES_REMEMBERED:
                self._copies.popitem(last=False)
        return {"tinker_path": path}

    def save_for_sampler(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """A named sampler checkpoint (`save_weights_for_sampler`), or a new sampling session on the weights of
        now (`save_weights_and_get_sampling_client`): a snapshot checkpoint, or for kind "inflight" the live adapter."""
        job = self.model_job(principal, body.get("model_id"))
        seq = body.get("seq_id")
        if body.get("path") is not None:

            def named() -> tuple[bytes, dict[str, Any]]:
                return b"", {
                    "checkpoint_id": names.SAMPLER_PREFIX + names.checkpoint_name(body["path"]),
                    "type": WEIGHTS_ONLY,
                    "ttl_seconds": self.service.checkpoints.validate_ttl(body.get("ttl_seconds")),
                }

            submitted = self._numbered(principal, job, seq, "save", named)
            return untyped_future(
                self.future_for(principal, "save_for_sampler", job["id"], submitted),
                model_id=body["model_id"],
            )
        session = self.sessions.of_model(job["id"])
        if session is None:
            raise ApiError(
                "session_not_found",
                f"model {body['model_id']} belongs to no live session; create a sampling client from a path",
            )
        sampler_id = names.sampling_session_id(session.id, integer_field(body, "sampling_session_seq_id"))
        base_model = job["sub_jobs"][0]["spec"]["base_model"]
        inflight = body.get("kind", "snapshot") == "inflight"
        checkpoint = f"{names.SAMPLER_PREFIX}ephemeral-{seq}"
        if sampler_id not in self.sessions.sampling:
            self.sessions.check_room(session)

        def snapshot() -> tuple[bytes, dict[str, Any]]:
            if body.get("kind", "snapshot") not in ("snapshot", "inflight"):
                raise ApiError(
                    "invalid_field",
                    f"kind: must be snapshot or inflight, got {body.get('kind')!r}",
                    {"field": "kind"},
                )
            return b"", {} if inflight else {"checkpoint_id": checkpoint, "type": WEIGHTS_ONLY}

        submitted = self._numbered(principal, job, seq, "noop" if inflight else "save", snapshot)
        if sampler_id not in self.sessions.sampling:
            self.sessions.sampling[sampler_id] = SamplingSession(
                sampler_id,
                principal.owner,
                base_model,
                live_job_id=job["id"] if inflight else None,
                checkpoint=None if inflight else (job["id"], checkpoint),
                ephemeral=not inflight,
            )
            session.samplers[body["sampling_session_seq_id"]] = sampler_id
        future = self.future_for(
            principal, "save_for_sampler", job["id"], submitted, sampling_session_id=sampler_id
        )
        return untyped_future(future, model_id=body["model_id"])

    def load_weights(self, principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """Onto a new model (`create_training_client_from_state*`: session_id + model_seq_id), or onto an existing
        one in its request order (model_id + seq_id)."""
        source_job, checkpoint_id, _ = names.parse_path(body.get("path"))
        row = self.service.checkpoints.find(
            principal, principal.owner, source_job, checkpoint_id, reading=True
        )
        restore = bool(body.get("optimizer"))
        if restore and row["type"] != RESUMABLE:
            raise ApiError(
                "invalid_field",
                f"path: {body['path']} holds no optimizer state (it was saved for sampling);"
                " load it without the optimizer",
                {"field": "optimizer"},
            )
        load = {"checkpoint_id": checkpoint_id, "source_job_id": source_job, "restore_optimizer": restore}
        if body.get("session_id") is None:
            job = self.model_job(principal, body.get("model_id"))
            submitted = self._numbered(principal, job, body.get("seq_id"), "load", lambda: (b"", load))
            future = self.future_for(
                principal, "load", job["id"], submitted, path=body["path"], model_id=body["model_id"]
            )
            return untyped_future(future, model_id=body["model_id"])
        session = self.sessions.live(principal, body["session_id"])
        seq = integer_field(body, "model_seq_id")
        model_id = names.model_id(session.id, seq)
        if seq in session.models:
            return untyped_future(
                self.futures.get(principal, f"load.{session.models[seq]}"), model_id=model_id
            )
        if body.get("base_model") not in (None, row["base_model"]):
            raise ApiError(
                "invalid_field",
                f"base_model: {body['path']} was trained on {row['base_model']}, not {body['base_model']}",
                {"field": "base_model"},
            )
        self.sessions.check_room(session)
        adapter = row["manifest"].get("adapter") or {}
        lora = {
            "r": adapter.get("r"),
            "alpha": adapter.get("lora_alpha"),
            "dropout": 0.0,
            "target_modules": adapter.get("target_modules"),
        }
        job_id = self._create_job(principal, session, seq, row["base_model"], lora)
        session.models[seq] = job_id
        submitted = self.service.requests.submit(principal, job_id, "load", b"", load, None)
        future = self.futures.add(
            Future(
                f"load.{job_id}",
                principal.owner,
                "load",
                job_id,
                submitted["id"],
                {"path": body["path"], "model_id": model_id},
            )
        )
        return untyped_future(future, model_id=model_id)

    def cancel(self, principal: Principal, body: dict[str, Any]) -> None:
        future = self.futures.get(principal, body.get("request_id"))
        if future.request_id is not None:
            with contextlib.suppress(ApiError):
                self.service.requests.cancel(principal, future.job_id, future.request_id)
