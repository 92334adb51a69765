"""Router replay, the service side (engine/router_replay.py is the workers'): the routes a sampler recorded,
kept until a trainer's forward replays them.

A `generate` with `record_routes` on an MoE base ends with, beside its samples, the experts each sample's
whole sequence (prompt and sample) routed to: a frame from the worker. The service keeps them here, in
memory, per job, one entry per sample under the `routes_id` its sample now carries, within a cap of bytes
per job (`router_replay_cache_full` past it, never a silent drop). A `forward_backward` or `forward` whose
frame metadata names `router_replay` (one `routes_id` per row) gets the routes added to its frame in its
batch's layout (`router_replay_experts`), once they are checked to fit: one id per row, each row's tokens the
start of the recorded sequence, the base model that sampled them. Discarding (some ids, or all of a job's)
frees them; a job's routes go when it ends.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from cortex_nb.protocol import wire
from cortex_nb.protocol.errors import ApiError

from .models import ModelInfo

DEFAULT_CAP_BYTES = 256 * 2**20
REPLAY_TENSOR = "router_replay_experts"  # engine/router_replay.py reads it under the same name
# model_type -> what the engine replays (engine/router_replay.REPLAYABLE_ROUTERS)
REPLAYABLE_TYPES = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE"}
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass
class Routes:
    """One sample's routes: its whole sequence and, per MoE layer, the experts of each of its tokens."""

    job_id: str
    sub_job_id: str
    base_model: str
    tokens: np.ndarray  # (tokens,) int32
    experts: np.ndarray  # (layers, tokens, top_k) int16

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.experts.nbytes)


def replay_refusal(info: ModelInfo) -> str | None:
    """Why router replay cannot work on this base, or None when it can."""
    config = info.config or {}
    model_type = str(config.get("model_type") or "")
    if model_type in REPLAYABLE_TYPES:
        return None
    architecture = (config.get("architectures") or [model_type or info.name])[0]
    if any(config.get(key) for key in EXPERT_COUNT_KEYS):
        return (
            f"router replay: {info.name} ({architecture}) is an MoE whose routing the engine cannot replay"
            f" (it replays {sorted(REPLAYABLE_TYPES.values())}); train with free routing"
        )
    return (
        f"router replay: {info.name} ({architecture}) is a dense model with no MoE router, so there is no"
        f" routing to record or replay; use an MoE base ({', '.join(sorted(REPLAYABLE_TYPES.values()))})"
    )


def check_replayable(info: ModelInfo) -> None:
    reason = replay_refusal(info)
    if reason is not None:
        raise ApiError("router_replay_unsupported", reason, {"base_model": info.name})


class RouterReplays:
    """Every job's recorded routes, by `routes_id`, within each job's cap."""

    def __init__(self, default_cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.default_cap_bytes = default_cap_bytes
        self._routes: dict[str, Routes] = {}
        self._held: dict[str, int] = {}
        self._caps: dict[str, int] = {}
        self.recording: set[str] = set()  # generate requests whose routes are on their way
        # job -> (source sub-job, target trainer) of a bootstrapped pairing: the source records every generate
        self._pairings: dict[str, tuple[str, str]] = {}

    # caps -----------------------------------------------------------------------------------------
    def cap(self, job_id: str) -> int:
        return self._caps.get(job_id, self.default_cap_bytes)

    def set_cap(self, job_id: str, cap_bytes: int) -> int:
        """A job's own cap, at most the backend's; returns the cap in force."""
        if cap_bytes <= 0:
            raise ApiError("invalid_field", "max_cache_bytes: must be positive", {"field": "max_cache_bytes"})
        self._caps[job_id] = min(int(cap_bytes), self.default_cap_bytes)
        return self._caps[job_id]

    def held(self, job_id: str) -> int:
        return self._held.get(job_id, 0)

    def check_room(self, job_id: str) -> None:
        """Refuse to record more for a job already at its cap (a generate's routes are checked again when
        they arrive)."""
        if self.held(job_id) >= self.cap(job_id):
            raise self._full(job_id, 0)

    def _full(self, job_id: str, adding: int) -> ApiError:
        return ApiError(
            "router_replay_cache_full",
            f"router replay: job {job_id} holds {self.held(job_id):,} bytes of recorded routes"
            + (f" and this generate's are {adding:,} more" if adding else "")
            + f"; its cap is {self.cap(job_id):,}. Discard routes already trained on"
            f" (POST /v1/jobs/{job_id}/router_replay/discard, or the Cortex SDK's router_replay_discard), or"
            " record fewer samples at once",
            {"held_bytes": self.held(job_id), "cap_bytes": self.cap(job_id)},
        )

    # recording --------------------------------------------------------------------------------------
    def bootstrap(self, job_id: str, source: str, target: str, cap_bytes: int | None) -> dict[str, Any]:
        """Pair a sampler with a trainer: every later generate on `source` records its routes."""
        if cap_bytes is not None:
            self.set_cap(job_id, cap_bytes)
        self._pairings[job_id] = (source, target)
        return {
            "status": "ready",
            "source_sub_job_id": source,
            "target_sub_job_id": target,
            "max_cache_bytes": self.cap(job_id),
            "held_bytes": self.held(job_id),
        }

    def records_every_generate(self, job_id: str, sub_job_id: str) -> bool:
        pairing = self._pairings.get(job_id)
        return pairing is not None and pairing[0] == sub_job_id

    def keep(self, job_id: str, sub: dict[str, Any], result: dict[str, Any], frame: bytes) -> dict[str, Any]:
        """Keep a generate's routes (the worker's frame); its result with a `routes_id` in every sample."""
        tensors, _ = wire.decode_frame(frame)
        samples = result.get("samples") or []
        entries = [
            Routes(
                job_id,
                sub["id"],
                sub["spec"]["base_model"],
                np.asarray(tensors[f"tokens.{i}"], dtype=np.int32),
                np.asarray(tensors[f"experts.{i}"], dtype=np.int16),
            )
            for i in range(len(samples))
        ]
        adding = sum(entry.nbytes for entry in entries)
        if self.held(job_id) + adding > self.cap(job_id):
            raise self._full(job_id, adding)
        ids = []
        for entry in entries:
            routes_id = "rr-" + secrets.token_hex(8)
            self._routes[routes_id] = entry
            ids.append(routes_id)
        self._held[job_id] = self.held(job_id) + adding
        return {
            **result,
            "samples": [{**sample, "routes_id": rid} for sample, rid in zip(samples, ids, strict=True)],
            "routes_bytes": adding,
        }

    # replay -----------------------------------------------------------------------------------------
    def attach(
        self, job_id: str, sub: dict[str, Any], info: ModelInfo, frame: bytes, metadata: dict[str, Any]
    ) -> bytes:
        """The frame of a forward_backward or forward that names routes, with its batch's routes added."""
        check_replayable(info)
        names = metadata["router_replay"]
        tensors, _ = wire.decode_frame(frame)
        input_ids = np.asarray(tensors["input_ids"])
        batch, length = input_ids.shape
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ApiError(
                "invalid_frame",
                "router_replay: a list of routes ids, one per row of the batch",
                {"field": "router_replay"},
            )
        if len(names) != batch:
            raise _mismatch(f"router_replay names {len(names)} routes for a batch of {batch} rows")
        mask = tensors.get("attention_mask")
        rows = []
        for row, name in enumerate(names):
            routes = self._routes.get(name)
            if routes is None or routes.job_id != job_id:
                raise ApiError(
                    "unknown_routes",
                    f"router_replay[{row}]: job {job_id} holds no routes {name!r} (never recorded for this job,"
                    " or discarded); sample again with record_routes",
                    {"field": "router_replay", "routes_id": name},
                )
            if routes.base_model != sub["spec"]["base_model"]:
                raise _mismatch(
                    f"router_replay[{row}]: {name} was recorded on {routes.base_model}, this sub-job trains"
                    f" {sub['spec']['base_model']}"
                )
            positions = np.flatnonzero(mask[row]) if mask is not None else np.arange(length)
            tokens = input_ids[row, positions]
            if len(tokens) > len(routes.tokens):
                raise _mismatch(
                    f"router_replay[{row}]: the row has {len(tokens)} tokens, {name} recorded"
                    f" {len(routes.tokens)} (the prompt and its sample)"
                )
            if not np.array_equal(tokens, routes.tokens[: len(tokens)]):
                first = int(np.flatnonzero(tokens != routes.tokens[: len(tokens)])[0])
                raise _mismatch(
                    f"router_replay[{row}]: the row's token {first} is {int(tokens[first])}, the sequence"
                    f" {name} recorded has {int(routes.tokens[first])} there; a row replays the routes of the"
                    " sample it holds (prompt then sample, from its start)"
                )
            rows.append((positions, routes.experts[:, : len(tokens)]))
        if len({experts.shape[0] for _, experts in rows}) != 1 or len({e.shape[2] for _, e in rows}) != 1:
            raise _mismatch("router_replay: the named routes come from models with other MoE layouts")
        layers, _, top_k = rows[0][1].shape
        # Padding positions route to the first experts: they are masked out of attention and of the loss.
        replay = np.broadcast_to(np.arange(top_k, dtype=np.int32), (layers, batch, length, top_k)).copy()
        for row, (positions, experts) in enumerate(rows):
            replay[:, row, positions] = experts
        _, frame_metadata = wire.decode_frame(frame, copy=False)
        return wire.encode_frame({**tensors, REPLAY_TENSOR: replay}, frame_metadata)

    # discarding -------------------------------------------------------------------------------------
    def discard(self, job_id: str, routes_ids: list[str] | None) -> dict[str, Any]:
        """Free the named routes of a job (all of them when none are named); ids it does not hold are
        reported, not refused (a retried discard finds them gone)."""
        names = (
            [name for name, routes in self._routes.items() if routes.job_id == job_id]
            if not routes_ids
            else list(routes_ids)
        )
        freed, missing = 0, []
        discarded = 0
        for name in names:
            routes = self._routes.get(name)
            if routes is None or routes.job_id != job_id:
                missing.append(name)
                continue
            del self._routes[name]
            freed += routes.nbytes
            discarded += 1
        self._held[job_id] = self.held(job_id) - freed
        return {
            "discarded": discarded,
            "freed_bytes": freed,
            "not_held": missing,
            "held_bytes": self.held(job_id),
            "cap_bytes": self.cap(job_id),
        }

    def job_ended(self, job_id: str) -> None:
        self.discard(job_id, None)
        self._held.pop(job_id, None)
        self._caps.pop(job_id, None)
        self._pairings.pop(job_id, None)


def _mismatch(message: str) -> ApiError:
    return ApiError("router_replay_mismatch", message, {"field": "router_replay"})
