"""Jobs waiting for memory on an adapter host: a slot that did not fit now (host_budget.py) sends its job
back to the queue, where it waits until a slot of that device frees, instead of failing.

A waiting job keeps its place in the queue and stops the queue there, as a job waiting for a device slot
does (scheduler.py). It is retried when a job that held a slot on that device frees it, never on a timer
alone: on a budget (`--adapter-host-memory`) nothing else can make room. A slot freed while the job was
starting (between its admission and its refusal) counts too, so no wake-up is missed. Two jobs whose
partly started sub-jobs refuse each other could wake each other without end; each refusal in a row
therefore doubles a short backoff (`RETRY_BACKOFF_S`, at most `MAX_RETRY_BACKOFF_S`) before the next try.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

RETRY_BACKOFF_S = 0.5
MAX_RETRY_BACKOFF_S = 30.0


@dataclass
class RoomWait:
    device_id: str
    # What the host said: the bytes of the slot, the base, the other slots and the budget.
    reason: str
    # Not retried before this (the scheduler's clock), however soon a slot frees.
    not_before: float
    # A slot of the device freed since the refusal: the job may fit now.
    freed: bool


class RoomWaits:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._waits: dict[str, RoomWait] = {}
        # job -> refusals in a row (until it runs or ends): the backoff before its next try
        self._refusals: dict[str, int] = {}
        # device id -> how many times a job that held a slot there freed it
        self._frees: dict[str, int] = {}
        # job -> the devices' free counts when it was admitted (a slot freed while it started)
        self._frees_at_admission: dict[str, dict[str, int]] = {}
        # job -> the devices where a sub-job of it got a slot (loaded and reported ready)
        self._holding: dict[str, set[str]] = {}

    def holds(self, job_id: str) -> bool:
        """Whether a queued job must not be admitted yet: it waits for room, or for its backoff."""
        wait = self._waits.get(job_id)
        return wait is not None and (not wait.freed or self.clock() < wait.not_before)

    def reason(self, job_id: str) -> str | None:
        wait = self._waits.get(job_id)
        return wait.reason if wait is not None else None

    def retry_in(self, job_id: str) -> float | None:
        """Seconds until a woken job's backoff has passed (None: it waits for a slot to free, or is not held)."""
        wait = self._waits.get(job_id)
        if wait is None or not wait.freed:
            return None
        return max(0.0, wait.not_before - self.clock())

    def device_of(self, job_id: str) -> str | None:
        wait = self._waits.get(job_id)
        return wait.device_id if wait is not None else None

    # what happens to a job ----------------------------------------------------------------------
    def admitted(self, job_id: str, device_ids: Iterable[str]) -> None:
        self._waits.pop(job_id, None)
        self._frees_at_admission[job_id] = {device: self._frees.get(device, 0) for device in device_ids}

    def slot_ready(self, job_id: str, device_id: str) -> None:
        self._holding.setdefault(job_id, set()).add(device_id)

    def ran(self, job_id: str) -> None:
        """All its sub-jobs fit: the next refusal (after a restart of the job) starts the backoff afresh."""
        self._refusals.pop(job_id, None)

    def refused(self, job_id: str, device_id: str, reason: str) -> None:
        """A sub-job of the job did not fit on its device now: it waits (once set aside and queued again)."""
        refusals = self._refusals[job_id] = self._refusals.get(job_id, 0) + 1
        at_admission = self._frees_at_admission.pop(job_id, {})
        missed = self._frees.get(device_id, 0) != at_admission.get(device_id, self._frees.get(device_id, 0))
        backoff = min(RETRY_BACKOFF_S * 2 ** (refusals - 1), MAX_RETRY_BACKOFF_S)
        self._waits[job_id] = RoomWait(device_id, reason, self.clock() + backoff, freed=missed)

    def released(self, job_id: str) -> list[float]:
        """The job's slots are free (its workers stopped). Returns, for each job this woke that is still in
        its backoff, the seconds until it may be tried."""
        self._frees_at_admission.pop(job_id, None)
        devices = self._holding.pop(job_id, set())
        for device in devices:
            self._frees[device] = self._frees.get(device, 0) + 1
        woken = [
            wait
            for holder, wait in self._waits.items()
            if holder != job_id and wait.device_id in devices and not wait.freed
        ]
        for wait in woken:
            wait.freed = True
        now = self.clock()
        return sorted({wait.not_before - now for wait in woken if wait.not_before > now})

    def forget(self, job_id: str) -> None:
        """The job ended: it waits for nothing any more."""
        self._waits.pop(job_id, None)
        self._refusals.pop(job_id, None)
        self._frees_at_admission.pop(job_id, None)
