"""Weight syncs, the service side (engine/weight_sync.py is the workers'): a job-level request between the trainer and its samplers.

One `weight_sync` request R is queued on the training sub-job (op `weight_sync`) and, in the same IO
loop turn, a companion `weight_sync_apply` is queued on every target sub-job. Each participant
reaches the sync in its own first-in-first-out order, so requests submitted before R see the old
weights and requests submitted after it see the new ones. The workers then talk through the service
(engine/weight_sync.py has the exchange); this module only checks who may talk to whom and relays
the messages, so nothing here blocks the IO loop. R's result is the trainer's report. When R ends
other than successfully, the companions are cancelled so no sampler waits for a payload that will
never come.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError
from cortex_nb.protocol.schemas.data_plane import WeightSyncBody

from .checkpoints import check_adapters_match
from .executors.base import Executor

log = logging.getLogger("cortex_backend.weight_sync")

TARGET_TYPES = (states.SAMPLING, states.LOG_PROBABILITY)


def companion_id(request_id: str, target: str) -> str:
    """The id of a target's side of sync `request_id` (internal: never a stored request)."""
    return f"{request_id}:{target}"


@dataclass
class ActiveSync:
    job_id: str
    source: str
    targets: tuple[str, ...]
    relayed_bytes: int = 0


class WeightSyncCoordinator:
    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._syncs: dict[str, ActiveSync] = {}

    # submission -------------------------------------------------------------------------------
    def source(self, job: dict[str, Any], body: WeightSyncBody) -> dict[str, Any]:
        """The training sub-job that sends its weights (`source`, or the job's trainer)."""
        trainers = [sub for sub in job["sub_jobs"] if sub["type"] == states.TRAINING]
        requested = body.source
        if requested is not None:
            trainers = [sub for sub in trainers if sub["id"] == requested]
            if not trainers:
                raise ApiError(
                    "invalid_field",
                    f"source: {requested!r} is not a training sub-job of job {job['id']}",
                    {"field": "source"},
                )
        if not trainers:
            raise ApiError(
                "unsupported_operation", f"job {job['id']} has no training sub-job to sync weights from"
            )
        return trainers[0]

    def prepare(self, job: dict[str, Any], source: dict[str, Any], body: WeightSyncBody) -> dict[str, Any]:
        weight_format = body.format
        by_id = {sub["id"]: sub for sub in job["sub_jobs"]}
        requested = body.targets
        if requested is None:
            targets = [sub["id"] for sub in job["sub_jobs"] if sub["type"] == states.SAMPLING]
        elif len(set(requested)) == len(requested):
            targets = list(requested)
        else:
            raise ApiError(
                "invalid_field", "targets: must be a list of distinct sub-job ids", {"field": "targets"}
            )
        if not targets:
            raise ApiError(
                "invalid_field",
                f"targets: job {job['id']} has no sampling sub-job to sync into",
                {"field": "targets"},
            )
        for target in targets:
            sub = by_id.get(target)
            if sub is None or sub["type"] not in TARGET_TYPES:
                raise ApiError(
                    "invalid_field",
                    f"targets: {target!r} is not a sampling or log_probability sub-job of job"
                    f" {job['id']} (it has {sorted(by_id)})",
                    {"field": "targets"},
                )
            check_adapters_match(
                (source.get("info") or {}).get("adapter"),
                (sub.get("info") or {}).get("adapter"),
                f"the trainer {source['id']}'s adapter",
                f"sub-job {target}",
            )
        return {"targets": targets, "format": weight_format}

    def dispatch(self, job_id: str, request_id: str, source: str, params: dict[str, Any]) -> None:
        """Queue the sync on the trainer and its companions on the targets, in one turn of the IO loop."""
        self._syncs[request_id] = ActiveSync(job_id, source, tuple(params["targets"]))
        for target in params["targets"]:
            self.executor.submit(
                job_id,
                target,
                companion_id(request_id, target),
                "weight_sync_apply",
                {"sync_id": request_id, "source": source},
                b"",
            )
        self.executor.submit(job_id, source, request_id, "weight_sync", params, b"")

    # relaying ---------------------------------------------------------------------------------
    def route(self, job_id: str, sender: str, header: dict[str, Any], blob: bytes) -> None:
        """Relay one message between the trainer and a target of the same sync; drop anything else."""
        sync = self._syncs.get(str(header.get("request_id")))
        recipient = header.get("to")
        participants = {sync.source, *sync.targets} if sync is not None else set()
        if (
            sync is None
            or sync.job_id != job_id
            or sender not in participants
            or recipient not in participants
            or (sender == sync.source) == (recipient == sync.source)
        ):
            log.debug("dropped a sync message from %s/%s to %r", job_id, sender, recipient)
            return
        sync.relayed_bytes += len(blob)
        self.executor.deliver(job_id, recipient, {**header, "from": sender}, blob)

    def relayed_bytes(self, request_id: str) -> int | None:
        sync = self._syncs.get(request_id)
        return sync.relayed_bytes if sync is not None else None

    def request_ended(self, job_id: str, request_id: str, status: str) -> None:
        sync = self._syncs.pop(request_id, None)
        if sync is not None and status != states.REQUEST_SUCCEEDED:
            for target in sync.targets:
                self.executor.cancel_request(job_id, target, companion_id(request_id, target))
