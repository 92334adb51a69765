"""Data-plane requests: validate, queue on the right sub-job, record events and results, cancel.

Every operation answers at once with a request id; the work runs in the sub-job's worker in
submission order. Results stay readable after the fact (polling never drains anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cortex_nb.protocol import routes, states, wire
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.losses import LOSSES
from cortex_nb.protocol.schemas.base import parse
from cortex_nb.protocol.schemas.data_plane import LoadBody, SaveBody

from .auth import Principal
from .checkpoints import CheckpointManager
from .executors.base import Executor
from .jobs import JobManager
from .models import ModelCatalog, ModelInfo
from .numbered_submissions import SequenceStream, SequenceStreams
from .operations import DEFAULT_TARGETS, FRAME_OPERATIONS, SERVED_BY_TYPE
from .router_replays import REPLAY_TENSOR, RouterReplays, check_replayable
from .store import Store
from .validation import validate_loss, validate_prompts, validate_token_batch
from .waiters import Waiters
from .weight_syncs import WeightSyncCoordinator

# Frames larger than this are checked in a thread, so the IO loop keeps answering meanwhile.
OFF_LOOP_FRAME_BYTES = 1 << 20
MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class PreparedCall:
    """What an operation's payload check reads: the sub-job, the body (frame and parsed JSON), who asks."""

    sub: dict[str, Any]
    body: bytes
    json_body: Any
    job: dict[str, Any] | None
    principal: Principal | None
    request_id: str


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


def max_seq_len(sub: dict[str, Any], catalog: ModelCatalog) -> int:
    info = catalog.get(sub["spec"]["base_model"])
    return int(sub["spec"].get("max_seq_len") or info.max_positions or 2048)


class RequestManager:
    def __init__(
        self,
        store: Store,
        catalog: ModelCatalog,
        jobs: JobManager,
        executor: Executor,
        *,
        checkpoints: CheckpointManager,
        weight_sync: WeightSyncCoordinator,
        router_replays: RouterReplays | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.jobs = jobs
        self.executor = executor
        self.checkpoints = checkpoints
        self.weight_sync = weight_sync
        self.router_replays = router_replays or RouterReplays()
        self.waiters = Waiters()
        self._active: dict[str, set[str]] = {}
        self._streams = SequenceStreams()
        self._arrivals: dict[str, asyncio.Lock] = {}
        # Called with (request row, result) when a request succeeds, e.g. to fold it into the job's progress.
        self.on_succeeded: list[Callable[[dict[str, Any], dict[str, Any]], None]] = []
        self._folded: set[str] = set()  # succeeded requests folded, whose end the store has yet to record
        # Checks of (job, op) that may refuse a client's request with an ApiError: the backend draining,
        # a load racing a managed loop.
        self.admission_checks: list[Callable[[dict[str, Any], str], None]] = []
        # Called with (job_id, sub_job_id, request_id, op, params, blob) before a request goes to its worker;
        # one that returns True holds the request and sends it later itself (parking.py: a parked job's
        # worker is gone until its state is loaded into a new one).
        self.dispatch_holds: list[Callable[[str, str, str, str, dict[str, Any], bytes], bool]] = []
        jobs.on_job_ended.append(self._job_ended)
        # The payload check of each operation that has one (operations.CATALOG lists them all).
        self._preparers: dict[str, Callable[[PreparedCall], tuple[dict[str, Any], bytes]]] = {
            "save": self._prepare_save,
            "load": self._prepare_load,
            "weight_sync": self._prepare_weight_sync,
            "forward_backward": self._prepare_forward_backward,
            "forward": self._prepare_forward,
            "step": self._prepare_step,
            "generate": self._prepare_generate,
        }

    # submission -------------------------------------------------------------------------------
    def choose_sub_job(self, job: dict[str, Any], op: str, requested: str | None) -> dict[str, Any]:
        subs = job["sub_jobs"]
        if requested is not None:
            match = [sub for sub in subs if sub["id"] == requested]
            if not match:
                raise ApiError(
                    "invalid_field",
                    f"sub_job: job {job['id']} has no sub-job {requested!r}; it has {[s['id'] for s in subs]}",
                    {"field": "sub_job"},
                )
            sub = match[0]
            if op not in SERVED_BY_TYPE[sub["type"]]:
                raise ApiError("unsupported_operation", f"a {sub['type']} sub-job does not serve {op}")
            return sub
        for sub_type in DEFAULT_TARGETS[op]:
            for sub in subs:
                if sub["type"] == sub_type:
                    return sub
        raise ApiError(
            "unsupported_operation",
            f"job {job['id']} has no sub-job that serves {op} (it has {[s['type'] for s in subs]}); "
            f"{op} needs one of {list(DEFAULT_TARGETS[op])}",
        )

    def prepare(
        self,
        op: str,
        sub: dict[str, Any],
        body: bytes,
        json_body: Any,
        *,
        job: dict[str, Any] | None = None,
        principal: Principal | None = None,
        request_id: str = "",
    ) -> tuple[dict[str, Any], bytes]:
        """Check the payload for `op` against what the sub-job can take (its body was parsed with the
        route's schema); return the worker's params and binary frame. An operation with no preparer
        (noop, reset_prefix_cache) takes no params."""
        preparer = self._preparers.get(op)
        if preparer is None:
            return {}, b""
        return preparer(PreparedCall(sub, body, json_body, job, principal, request_id))

    # checkpoints and weight sync: a save reserves its id and bytes, a load holds its checkpoint
    def _prepare_save(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        return self.checkpoints.prepare_save(call.request_id, call.job, call.sub, call.json_body), b""

    def _prepare_load(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        return self.checkpoints.prepare_load(
            call.request_id, call.principal, call.job, call.sub, call.json_body
        ), b""

    def _prepare_weight_sync(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        return self.weight_sync.prepare(call.job, call.sub, call.json_body), b""

    def _prepare_forward_backward(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        info = self.catalog.get(call.sub["spec"]["base_model"])
        tensors, metadata = wire.decode_frame(call.body, copy=False)
        loss, config = validate_loss(metadata)
        validate_token_batch(
            tensors,
            loss.tensors,
            info,
            max_seq_len(call.sub, self.catalog),
            loss.multi_target,
            loss.wide,
            loss.name,
        )
        # Tokens trained on (the attention-mask sum): what the job's progress record counts.
        mask = tensors.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else int(tensors["input_ids"].size)
        # The worker computes with these validated params, never with the frame's own metadata.
        params = {
            "loss_fn": loss.name,
            "loss_fn_config": config,
            "batch_shape": list(tensors["input_ids"].shape),
            "tokens": tokens,
        }
        return self._routing(call, info, tensors, metadata, params)

    def _routing(
        self,
        call: PreparedCall,
        info: ModelInfo,
        tensors: dict[str, Any],
        metadata: dict[str, Any],
        params: dict[str, Any],
    ) -> tuple[dict[str, Any], bytes]:
        """A forward_backward or forward that replays recorded routes gets them in its frame
        (router_replays.py); one that asks for the experts it used says so to the worker."""
        if REPLAY_TENSOR in tensors:
            raise ApiError(
                "invalid_frame",
                f"{REPLAY_TENSOR} is added by the backend from recorded routes; name them with the frame's"
                " `router_replay` metadata instead",
                {"field": REPLAY_TENSOR},
            )
        body = call.body
        if metadata.get("router_replay") is not None:
            body = self.router_replays.attach(call.sub["job_id"], call.sub, info, call.body, metadata)
            params["router_replay"] = True
        if metadata.get("record_routes"):
            check_replayable(info)
            params["record_routes"] = True
        return params, body

    def _prepare_forward(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        info = self.catalog.get(call.sub["spec"]["base_model"])
        tensors, metadata = wire.decode_frame(call.body, copy=False)
        params: dict[str, Any] = {}
        # Scoring alone takes K targets per position as cross_entropy does (weights, if sent, of their shape).
        scoring = LOSSES["cross_entropy"]
        required, multi_target, wide, name = ("target_tokens",), scoring.multi_target, (), "forward"
        if metadata.get("loss_fn") is not None:
            # a Tinker `forward` with a loss: the loss's value and logprobs, no gradients
            loss, params["loss_fn_config"] = validate_loss(metadata)
            params["loss_fn"], required = loss.name, loss.tensors
            multi_target, wide, name = loss.multi_target, loss.wide, loss.name
        validate_token_batch(
            tensors, required, info, max_seq_len(call.sub, self.catalog), multi_target, wide, name
        )
        if metadata.get("adapter") is not None:
            params["adapter"] = self.checkpoints.prepare_adapter(
                call.request_id, call.principal, call.job, call.sub, metadata["adapter"]
            )
        params["batch_shape"] = list(tensors["input_ids"].shape)
        return self._routing(call, info, tensors, metadata, params)

    def _prepare_step(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        return call.json_body.model_dump(), b""

    def _prepare_generate(self, call: PreparedCall) -> tuple[dict[str, Any], bytes]:
        info = self.catalog.get(call.sub["spec"]["base_model"])
        json_body = call.json_body
        sampling = json_body.sampling_params
        limit = max_seq_len(call.sub, self.catalog)
        prompts = validate_prompts(json_body.prompts, self.catalog, info, sampling.max_tokens, limit)
        generate = {"prompt_tokens": prompts, "sampling_params": sampling.model_dump()}
        if json_body.stream:
            generate["stream"] = True
        if json_body.adapter is not None:
            adapter = json_body.adapter
            generate["adapter"] = self.checkpoints.prepare_adapter(
                call.request_id,
                call.principal,
                call.job,
                call.sub,
                adapter if isinstance(adapter, str) else adapter.model_dump(exclude_none=True),
            )
        job_id = call.sub["job_id"]
        if sampling.record_routes or self.router_replays.records_every_generate(job_id, call.sub["id"]):
            # Last: nothing after this refuses the request, so no recording is left waiting for nothing.
            check_replayable(info)
            self.router_replays.check_room(job_id)
            self.router_replays.recording.add(call.request_id)
            generate["sampling_params"]["record_routes"] = True
        return generate, b""

    def submit(
        self,
        principal: Principal,
        job_id: str,
        op: str,
        body: bytes,
        json_body: Any,
        sub_job: str | None,
        sequence: tuple[str, int] | None = None,
    ) -> dict[str, Any]:
        """Queue `op` on the job. `json_body` is the operation's `Body` (a handler parsed it), or the dict a
        compatibility face built, parsed here with the same schema. With `sequence` (stream name, number),
        a number already submitted answers with the same request (a retry runs once), and a number that
        arrives early waits until the numbers before it have been submitted (per-stream order, whatever
        the arrival order)."""
        stream, seen = self._admit(principal, job_id, sequence)
        if seen is not None:
            return seen
        with self._refusal_uses_up(job_id, stream, sequence):
            job, sub, json_body = self._target(principal, job_id, op, json_body, sub_job)
            request_id = new_request_id()
            params, blob = self.prepare(
                op, sub, body, json_body, job=job, principal=principal, request_id=request_id
            )
            self._enqueue(job_id, sub, request_id, op, params, blob, stream, sequence[1] if sequence else 0)
            return self.store.get_request(request_id)

    async def submit_async(
        self,
        principal: Principal,
        job_id: str,
        op: str,
        body: bytes,
        json_body: Any,
        sub_job: str | None,
        sequence: tuple[str, int] | None = None,
    ) -> dict[str, Any]:
        """`submit`, with a large frame's checks off the IO loop (they read every value of it). Requests of
        one job still queue in the order they arrived: each waits for the one before it."""
        arrivals = self._arrivals.setdefault(job_id, asyncio.Lock())
        try:
            async with arrivals:
                if op not in FRAME_OPERATIONS or len(body) <= OFF_LOOP_FRAME_BYTES:
                    return self.submit(principal, job_id, op, body, json_body, sub_job, sequence)
                stream, seen = self._admit(principal, job_id, sequence)
                if seen is not None:
                    return seen
                with self._refusal_uses_up(job_id, stream, sequence):
                    job, sub, json_body = self._target(principal, job_id, op, json_body, sub_job)
                    request_id = new_request_id()
                    params, blob = await asyncio.to_thread(
                        self.prepare,
                        op,
                        sub,
                        body,
                        json_body,
                        job=job,
                        principal=principal,
                        request_id=request_id,
                    )
                    # it may have ended meanwhile
                    job, sub, json_body = self._target(principal, job_id, op, json_body, sub_job)
                    self._enqueue(
                        job_id, sub, request_id, op, params, blob, stream, sequence[1] if sequence else 0
                    )
                    return self.store.get_request(request_id)
        finally:
            if not arrivals.locked():
                self._arrivals.pop(job_id, None)

    @contextlib.contextmanager
    def _refusal_uses_up(
        self, job_id: str, stream: SequenceStream | None, sequence: tuple[str, int] | None
    ) -> Iterator[None]:
        """A numbered submission refused while queueing uses its number up: a retry hears the same refusal."""
        try:
            yield
        except ApiError as exc:
            if stream is not None and sequence is not None:
                self._use_up(job_id, stream, sequence[1], exc)
            raise

    def _admit(
        self, principal: Principal, job_id: str, sequence: tuple[str, int] | None
    ) -> tuple[SequenceStream | None, dict[str, Any] | None]:
        """A numbered submission's stream, and the request a retry of its number already made (a number
        refused before is refused again with the same error)."""
        if sequence is None:
            return None, None
        self._check_accepting(self.jobs.visible_job(principal, job_id))
        stream = self._streams.stream(job_id, sequence)
        made = stream.made(sequence[1])
        return stream, self.store.get_request(made) if made is not None else None

    def _target(
        self, principal: Principal, job_id: str, op: str, json_body: Any, sub_job: str | None
    ) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """The job (visible, still taking requests), the sub-job that serves `op`, and the body as its schema."""
        job = self.jobs.visible_job(principal, job_id)
        self._check_accepting(job)
        for check in self.admission_checks:
            check(job, op)
        schema = routes.route(op).body
        if isinstance(schema, type) and not isinstance(json_body, schema):
            json_body = parse(schema, json_body or {})
        if op == "weight_sync":
            sub = self.weight_sync.source(job, json_body)
        else:
            if op == "load" and json_body.target_sub_job_id is not None:
                sub_job = json_body.target_sub_job_id
            sub = self.choose_sub_job(job, op, sub_job)
        return job, sub, json_body

    def _check_accepting(self, job: dict[str, Any]) -> None:
        if job["status"] in states.JOB_TERMINAL:
            raise ApiError(
                "job_finished",
                f"job {job['id']} is {job['status']}"
                + (f" ({job['failure_code']})" if job["failure_code"] else "")
                + "; create a new job (and load a checkpoint, if you saved one)",
                {"status": job["status"], "failure_code": job["failure_code"]},
            )
        if self.jobs.is_completing(job["id"]):
            raise ApiError("job_finished", f"job {job['id']} is completing and takes no new requests")

    def refuse(self, principal: Principal, job_id: str, sequence: tuple[str, int], error: ApiError) -> None:
        """A face refused a numbered submission before it reached `submit`: its number is used up all the same."""
        if self.jobs.visible_job(principal, job_id)["status"] in states.JOB_TERMINAL:
            return
        self._use_up(job_id, self._streams.stream(job_id, sequence), sequence[1], error)

    def _use_up(self, job_id: str, stream: SequenceStream, seq: int, error: ApiError) -> None:
        """A refused number: remember the refusal (a retry hears it again) and let the numbers after it go."""
        if stream.use_up(seq, error):
            self._release_in_order(job_id, stream)

    def sequenced(self, job_id: str, sequence: tuple[str, int]) -> dict[str, Any] | None:
        """The request a numbered submission already made, if any (so a face can skip work a retry would redo)."""
        stream = self._streams.find(job_id, sequence[0])
        request_id = stream.request_ids.get(sequence[1]) if stream is not None else None
        return self.store.get_request(request_id) if request_id is not None else None

    def submit_for_service(
        self,
        job: dict[str, Any],
        op: str,
        params: dict[str, Any],
        blob: bytes = b"",
        principal: Principal | None = None,
    ) -> str:
        """Queue a request the service makes itself on the job's training sub-job (a managed loop, the
        final save before a device is freed, a parked client's save and load); returns its id. It is an
        ordinary request: listed, cancellable, and it keeps the job from idling. A load reads its
        checkpoint as `principal` (the job's owner)."""
        sub = self.choose_sub_job(job, "save" if op == "save" else "step", None)
        request_id = new_request_id()
        if op == "save":
            params = self.checkpoints.prepare_save(request_id, job, sub, parse(SaveBody, params))
        elif op == "load" and principal is not None:
            params = self.checkpoints.prepare_load(request_id, principal, job, sub, parse(LoadBody, params))
        self._enqueue(job["id"], sub, request_id, op, params, blob)
        return request_id

    def _enqueue(
        self,
        job_id: str,
        sub: dict[str, Any],
        request_id: str,
        op: str,
        params: dict[str, Any],
        blob: bytes,
        stream: SequenceStream | None = None,
        seq: int = 0,
    ) -> None:
        """Record the request and send it to its sub-job, or (numbered, early) hold it until its turn."""
        # One commit for the request's rows, not one per statement: most of a small request's cost.
        try:
            with self.store.transaction():
                self.store.insert_request(
                    {
                        "id": request_id,
                        "job_id": job_id,
                        "sub_job_id": sub["id"],
                        "op": op,
                        "status": states.REQUEST_QUEUED,
                        "params": _recorded_params(params),
                    }
                )
                self.store.add_request_event(request_id, "queued", {"sub_job_id": sub["id"]})
                self.store.touch_job(job_id)
        except BaseException:
            # Not recorded (a full disk, a held lock): a save's id and bytes, or a load's hold, go back, so
            # that a retry with the same checkpoint id is not refused as taken.
            self.checkpoints.request_ended(request_id)
            raise
        self._active.setdefault(job_id, set()).add(request_id)
        if stream is None:
            self._dispatch(job_id, sub["id"], request_id, op, params, blob)
        else:
            if stream.hold(seq, (sub["id"], request_id, op, params, blob)):
                self.store.add_request_event(
                    request_id, "waiting_for_sequence", {"sequence": seq, "next": stream.next_seq}
                )
            self._release_in_order(job_id, stream)

    def _dispatch(
        self, job_id: str, sub_job_id: str, request_id: str, op: str, params: dict[str, Any], blob: bytes
    ) -> None:
        if any(hold(job_id, sub_job_id, request_id, op, params, blob) for hold in self.dispatch_holds):
            return
        if op == "weight_sync":
            self.weight_sync.dispatch(job_id, request_id, sub_job_id, params)
        else:
            self.executor.submit(job_id, sub_job_id, request_id, op, params, blob)

    def _release_in_order(self, job_id: str, stream: SequenceStream) -> None:
        """Dispatch held submissions whose turn came (numbered_submissions.py), unless cancelled meanwhile."""
        for sub_job_id, request_id, op, params, blob in stream.release():
            request = self.store.get_request(request_id)
            if request is not None and request["status"] == states.REQUEST_QUEUED:
                self._dispatch(job_id, sub_job_id, request_id, op, params, blob)

    # reading ----------------------------------------------------------------------------------
    def _visible_request(
        self, principal: Principal, job_id: str, request_id: str, *, tensors: bool = False
    ) -> dict[str, Any]:
        self.jobs.check_visible(principal, job_id)
        request = self.store.get_request(request_id, tensors=tensors)
        if request is None or request["job_id"] != job_id:
            raise ApiError("request_not_found", f"job {job_id} has no request {request_id!r}")
        return request

    async def get(
        self, principal: Principal, job_id: str, request_id: str, cursor: int, max_events: int, wait_s: float
    ) -> dict[str, Any]:
        """The request with events after `cursor`; waits up to `wait_s` for news when there is none."""
        request = self._visible_request(principal, job_id, request_id)
        events = self.store.request_events(request_id, cursor, max_events)
        if not events and request["status"] not in states.REQUEST_TERMINAL and wait_s > 0:
            await self.waiters.wait(request_id, min(wait_s, MAX_WAIT_S))
            request = self.store.get_request(request_id)
            events = self.store.request_events(request_id, cursor, max_events)
        return public_request(request, events, cursor)

    def list(self, principal: Principal, job_id: str, limit: int) -> list[dict[str, Any]]:
        """The job's requests, newest first, in the shape one request is polled in (less result and events)."""
        self.jobs.check_visible(principal, job_id)
        return [request_summary(row) for row in self.store.list_requests(job_id, limit)]

    def tensors(self, principal: Principal, job_id: str, request_id: str) -> bytes:
        request = self._visible_request(principal, job_id, request_id, tensors=True)
        if request["status"] != states.REQUEST_SUCCEEDED or not request["tensors"]:
            raise ApiError("not_found", f"request {request_id} has no tensors (status {request['status']})")
        return bytes(request["tensors"])

    def has_active(self, job_id: str) -> bool:
        return bool(self._active.get(job_id))

    def active_ops(self, job_id: str) -> list[str]:
        """The operations of a job's queued and running requests."""
        rows = (self.store.get_request(request_id) for request_id in self._active.get(job_id, ()))
        return [row["op"] for row in rows if row is not None]

    def cancel_for_service(self, job_id: str, request_id: str) -> None:
        """Stop a request the service made (a managed loop, when its device is freed)."""
        request = self.store.get_request(request_id)
        if request is not None and request["status"] not in states.REQUEST_TERMINAL:
            self.executor.cancel_request(job_id, request["sub_job_id"], request_id)
            self.store.add_request_event(request_id, "cancel_requested", {})
            self.waiters.notify(request_id)

    # router replay (router_replays.py) ------------------------------------------------------------
    def router_replay_bootstrap(
        self, principal: Principal, job_id: str, source: str, target: str, cap_bytes: int | None
    ) -> dict[str, Any]:
        """Make every later generate on `source` record routes for trainer `target` to replay."""
        job = self.jobs.visible_job(principal, job_id)
        self._check_accepting(job)
        subs = {sub["id"]: sub for sub in job["sub_jobs"]}
        if subs[source]["type"] not in (states.SAMPLING, states.TRAINING):
            raise ApiError(
                "invalid_field",
                f"source: {source} is a {subs[source]['type']} sub-job; routes are recorded by one that samples",
                {"field": "source"},
            )
        if subs[target]["type"] != states.TRAINING:
            raise ApiError(
                "invalid_field",
                f"target: {target} is a {subs[target]['type']} sub-job; routes are replayed by a trainer",
                {"field": "target"},
            )
        for sub in (subs[source], subs[target]):
            check_replayable(self.catalog.get(sub["spec"]["base_model"]))
        if subs[source]["spec"]["base_model"] != subs[target]["spec"]["base_model"]:
            raise ApiError(
                "router_replay_mismatch",
                f"router replay: {source} samples {subs[source]['spec']['base_model']}, {target} trains"
                f" {subs[target]['spec']['base_model']}; routes replay only on the base that recorded them",
            )
        return self.router_replays.bootstrap(job_id, source, target, cap_bytes)

    def router_replay_discard(
        self, principal: Principal, job_id: str, routes_ids: list[str] | None
    ) -> dict[str, Any]:
        """Free a job's recorded routes: the named ones, or all of them."""
        self.jobs.visible_job(principal, job_id)
        return self.router_replays.discard(job_id, routes_ids)

    # cancel -----------------------------------------------------------------------------------
    def cancel(self, principal: Principal, job_id: str, request_id: str) -> dict[str, Any]:
        request = self._visible_request(principal, job_id, request_id)
        if request["status"] == states.REQUEST_QUEUED:
            self.executor.cancel_request(job_id, request["sub_job_id"], request_id)
            self._finish(
                job_id,
                request_id,
                states.REQUEST_CANCELLED,
                error=("cancelled", "cancelled before it started"),
            )
        elif request["status"] == states.REQUEST_RUNNING:
            # The worker interrupts what it can (generate); other operations finish and say so.
            self.executor.cancel_request(job_id, request["sub_job_id"], request_id)
            self.store.add_request_event(request_id, "cancel_requested", {})
            self.waiters.notify(request_id)
        return public_request(self.store.get_request(request_id), [], 0)

    # executor callbacks -----------------------------------------------------------------------
    def started(self, job_id: str, request_id: str) -> None:
        if self.store.request_status(request_id) != states.REQUEST_QUEUED:
            return
        with self.store.transaction():
            self.store.update_request(request_id, status=states.REQUEST_RUNNING, started_at=time.time())
            self.store.add_request_event(request_id, "running", {})
        self.waiters.notify(request_id)

    def finished(self, job_id: str, request_id: str, message: dict[str, Any], blob: bytes) -> None:
        request = self.store.get_request(request_id)
        if request is None or request["status"] in states.REQUEST_TERMINAL:
            return
        status = message["status"]
        result = message.get("result")
        if status == states.REQUEST_SUCCEEDED and request["op"] == "save":
            # A save is valid only once the service has renamed and recorded it.
            try:
                result = {"checkpoint": self.checkpoints.commit_save(request_id, result or {})}
                result.update(
                    {
                        key: result["checkpoint"][key]
                        for key in ("checkpoint_id", "step", "size_bytes", "type")
                    }
                )
            except ApiError as exc:
                self._finish(job_id, request_id, states.REQUEST_FAILED, error=(exc.code, exc.message))
                return
        if request_id in self.router_replays.recording:
            self.router_replays.recording.discard(request_id)
            if status == states.REQUEST_SUCCEEDED:
                try:
                    sub = next(
                        sub for sub in self.store.sub_jobs(job_id) if sub["id"] == request["sub_job_id"]
                    )
                    result = self.router_replays.keep(job_id, sub, result or {}, blob)
                except ApiError as exc:
                    self._finish(job_id, request_id, states.REQUEST_FAILED, error=(exc.code, exc.message))
                    return
                blob = b""  # the routes live in router_replays, not as the request's tensors
        if status == states.REQUEST_SUCCEEDED and request["op"] == "weight_sync":
            result = {**(result or {}), "relayed_bytes": self.weight_sync.relayed_bytes(request_id)}
        if status == states.REQUEST_SUCCEEDED:
            # Folded before the request ends: its end may end the job (a completing one) and close the record.
            # A report the store refused is retried whole: what it folded already is not folded twice.
            if request_id not in self._folded:
                for callback in self.on_succeeded:
                    callback(request, result or {})
                self._folded.add(request_id)
            self._finish(job_id, request_id, status, result=result, tensors=blob or None)
            self._folded.discard(request_id)
        else:
            self._finish(
                job_id,
                request_id,
                status,
                error=(message.get("code", "operation_failed"), message.get("message", "")),
            )

    def _finish(
        self,
        job_id: str,
        request_id: str,
        status: str,
        result: dict[str, Any] | None = None,
        tensors: bytes | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "status": status,
            "finished_at": time.time(),
            "result": result,
            "tensors": tensors,
        }
        if error:
            fields.update(error_code=error[0], error_message=error[1])
        with self.store.transaction():
            self.store.update_request(request_id, **fields)
            self.store.add_request_event(request_id, status, {"error_code": error[0]} if error else {})
            self.store.touch_job(job_id)
        self.checkpoints.request_ended(request_id)
        self.weight_sync.request_ended(job_id, request_id, status)
        self.router_replays.recording.discard(request_id)
        self.waiters.notify(request_id)
        active = self._active.get(job_id)
        if active is not None:
            active.discard(request_id)
            if not active:
                self._active.pop(job_id, None)
                self.jobs.request_drained(job_id)

    def fail_active(self, job_id: str, code: str, message: str) -> None:
        """End a job's unfinished requests without ending the job (its worker is gone and the job is
        queued again: a training run's retry or preemption)."""
        for request_id in list(self._active.get(job_id, ())):
            request = self.store.get_request(request_id)
            if request is not None and request["status"] not in states.REQUEST_TERMINAL:
                self._finish(job_id, request_id, states.REQUEST_FAILED, error=(code, message))
        self._active.pop(job_id, None)

    def _job_ended(self, job_id: str, status: str, code: str | None, message: str | None) -> None:
        """A job ended: its unfinished requests end with it, with the job's reason."""
        self._streams.forget(job_id)
        self.router_replays.job_ended(job_id)
        for request_id in list(self._active.pop(job_id, set())):
            request = self.store.get_request(request_id)
            if request is None or request["status"] in states.REQUEST_TERMINAL:
                continue
            if status == states.JOB_CANCELLED:
                self._finish(
                    job_id, request_id, states.REQUEST_CANCELLED, error=("cancelled", "the job was cancelled")
                )
            else:
                self._finish(
                    job_id,
                    request_id,
                    states.REQUEST_FAILED,
                    error=(code or "job_finished", f"the job ended ({status}): {message or ''}".strip()),
                )

    async def final_status(self, request_id: str, timeout_s: float) -> str | None:
        """The request's status once it has ended (None if it vanished or did not end within `timeout_s`):
        for the service's own requests, whose end it acts on (parking, a job back after a restart)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.store.request_status(request_id)
            if status is None or status in states.REQUEST_TERMINAL:
                return status
            await self.waiters.wait(request_id, 1.0)
        return None

    def continue_streams_after_restart(self, job_id: str) -> None:
        """A job back after a restart: its numbered streams go on from the first number each hears."""
        self._streams.continue_after_restart(job_id)

    def recover_after_restart(self) -> None:
        for request in self.store.requests_with_status([states.REQUEST_QUEUED, states.REQUEST_RUNNING]):
            self.store.update_request(
                request["id"],
                status=states.REQUEST_FAILED,
                finished_at=time.time(),
                error_code="backend_restarted",
                error_message="the backend restarted while this request was in flight; submit it again",
            )
            self.store.add_request_event(
                request["id"], states.REQUEST_FAILED, {"error_code": "backend_restarted"}
            )


def _recorded_params(params: dict[str, Any]) -> dict[str, Any]:
    """What the store keeps of a request's params: no prompt tokens, and a saved adapter by name only."""
    recorded = {key: value for key, value in params.items() if key != "prompt_tokens"}
    if isinstance(recorded.get("adapter"), dict):
        recorded["adapter"] = recorded["adapter"]["key"]
    return recorded


def request_summary(request: dict[str, Any]) -> dict[str, Any]:
    """A request as listed (`RequestSummary`)."""
    error = None
    if request["error_code"]:
        error = {"code": request["error_code"], "message": request["error_message"]}
    return {
        "request_id": request["id"],
        "job_id": request["job_id"],
        "sub_job_id": request["sub_job_id"],
        "op": request["op"],
        "status": request["status"],
        "created_at": request["created_at"],
        "started_at": request["started_at"],
        "finished_at": request["finished_at"],
        "error": error,
    }


def public_request(request: dict[str, Any], events: list[dict[str, Any]], cursor: int) -> dict[str, Any]:
    """A request as polled (`RequestStatus`): its summary, result and events after `cursor`."""
    return {
        **request_summary(request),
        "result": request["result"],
        "has_tensors": bool(request["tensors_bytes"]),
        "events": events,
        "cursor": events[-1]["seq"] if events else cursor,
    }
