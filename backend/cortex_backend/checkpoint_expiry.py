"""Expiry: checkpoints past their TTL are deleted by the backend, except one still in use.

In use means read right now (a load, an export, a sample on its adapter), loaded by a job that has not ended
(so its trainer started from it), or held by a face (a live Tinker sampling client on it). Such a checkpoint
stays, and is deleted at the first sweep after it is free. Each decision is a line in the checkpoint's job log,
so `%cortex logs` says why a checkpoint went (or why an expired one is still there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from cortex_nb.protocol import states
from cortex_nb.protocol.errors import ApiError

from .checkpoints import CheckpointManager
from .store import Store

log = logging.getLogger("cortex_backend.checkpoint_expiry")

LIVE_JOB_STATUSES = (states.JOB_PENDING, states.JOB_STARTING, states.JOB_RUNNING)
# The longest wait between sweeps; a backend accepting shorter TTLs sweeps more often (half its shortest TTL).
MAX_SWEEP_S = 60.0

Key = tuple[str, str]


class CheckpointExpiry:
    def __init__(
        self, store: Store, checkpoints: CheckpointManager, log_line: Callable[[str, str], None]
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.log_line = log_line
        # Faces add what they hold: each returns (job id, checkpoint id) keys in use.
        self.holders: list[Callable[[], Iterable[Key]]] = []
        self._kept: set[Key] = set()

    @property
    def interval_s(self) -> float:
        return min(MAX_SWEEP_S, max(0.25, self.checkpoints.min_ttl_s / 2))

    def in_use(self) -> set[Key]:
        held = set(self.store.checkpoints_loaded_by_live_jobs(LIVE_JOB_STATUSES))
        for holder in self.holders:
            held.update(holder())
        return held

    def sweep(self, now: float | None = None) -> list[Key]:
        """Delete every expired checkpoint not in use; return the (job id, checkpoint id) deleted."""
        rows = self.store.expired_checkpoints(time.time() if now is None else now)
        if not rows:
            return []
        held = self.in_use()
        deleted: list[Key] = []
        for row in rows:
            key = (row["job_id"], row["id"])
            if row.get("kept"):
                continue  # marked keep: no expiry removes it
            if key in held or self.checkpoints.readers({"job_id": key[0], "id": key[1]}) > 0:
                if key not in self._kept:
                    self._kept.add(key)
                    self._say(row, f"checkpoint {row['id']} expired but is in use; it is deleted once free")
                continue
            try:
                self.checkpoints.remove(row)
            except ApiError as exc:  # read since the check above; the next sweep tries again
                log.info("expired checkpoint %s of job %s kept: %s", row["id"], row["job_id"], exc)
                continue
            self._kept.discard(key)
            deleted.append(key)
            self._say(row, f"checkpoint {row['id']} expired (its TTL ended) and was deleted")
        return deleted

    def _say(self, row: dict, line: str) -> None:
        log.info("%s (job %s)", line, row["job_id"])
        try:
            self.log_line(row["job_id"], line)
        except Exception:  # the log line is a courtesy; the deletion stands
            log.exception("could not log to job %s", row["job_id"])
