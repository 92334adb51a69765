"""Why a job waits: its place in the queue, who holds the device slots it needs, and when one may free.

An estimate comes from what the backend knows of each holder: a training run's ETA, an idle job's
`frees_at`, a keep-alive's end. A holder busy with a client's own requests could end at any time, so
when the slots a job waits for depend on such holders there is no estimate (null), never a guess.
A job waiting for memory on an adapter host (room_waits.py) gives the host's own reason, with the bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .auth import Principal
from .scheduler import Scheduler
from .store import Store

MAX_NAMED_HOLDERS = 5


# How long a holder's "frees in" reading is reused (each one reads the holder's job).
FREES_IN_TTL_S = 1.0


@dataclass
class _QueueSnapshot:
    """The queue as of one scheduler version: positions, the slots asked for ahead of each, and who every
    holder is, read in one batch so that a reason costs the same with 10 or 1,000 jobs waiting."""

    version: tuple[int, int]
    position: dict[str, int]
    slots_ahead: list[int]
    labels: dict[str, dict[str, Any]]
    frees_in: dict[str, tuple[float, float | None]] = field(default_factory=dict)


class QueueReasons:
    def __init__(self, store: Store, scheduler: Scheduler, frees_in: Callable[[str], float | None]) -> None:
        """`frees_in(holder_id)`: seconds until a holder frees its slots, None when unknown."""
        self.store = store
        self.scheduler = scheduler
        self.frees_in = frees_in
        self._snapshot_cache: _QueueSnapshot | None = None

    def _snapshot(self) -> _QueueSnapshot:
        # Aging moves holders up a band each `aging_s` without any event: a new band period is a new queue.
        version = (self.scheduler.version, int(self.scheduler.clock() // max(self.scheduler.aging_s, 1.0)))
        cached = self._snapshot_cache
        if cached is not None and cached.version == version:
            return cached
        pending = self.scheduler.pending_holders()
        slots_ahead = [0]
        for holder in pending:
            slots_ahead.append(slots_ahead[-1] + (self.scheduler.request_of(holder) or (0, 0, False))[0])
        labels = self.store.holder_labels([*pending, *self.scheduler.placed_holders()])
        self._snapshot_cache = _QueueSnapshot(
            version, {holder: index for index, holder in enumerate(pending)}, slots_ahead, labels
        )
        return self._snapshot_cache

    def for_job(self, job_id: str, principal: Principal | None = None) -> dict[str, Any] | None:
        """`{position, reason, blocked_by, estimate_s}` for a pending job; None for any other. Holders the
        principal may not see are counted, never named."""
        snapshot = self._snapshot()
        index = snapshot.position.get(job_id)
        if index is None:
            return None
        position = index + 1
        slots, min_memory, exclusive = self.scheduler.request_of(job_id)
        models = self.scheduler.models_of(job_id)
        devices = self.scheduler.eligible_devices(min_memory, exclusive, models)
        room_reason = self.scheduler.room_waits.reason(job_id)
        if room_reason is not None:  # the holders whose slots on its device would make room
            device_id = self.scheduler.room_waits.device_of(job_id)
            devices = [device for device in devices if device.id == device_id] or devices
        holders = self.scheduler.holders_on(devices)
        kind = "/".join(sorted({device.kind for device in devices})) or "device"
        adapter = self.scheduler.waits_for_adapter_slots(job_id, devices)
        if adapter:  # its sub-jobs would be slots of an adapter host
            devices = [device for device in devices if device.adapter_slots]
            total = sum(device.adapter_slots for device in devices)
            used = sum(self.scheduler.adapter_slots_in_use(device) for device in devices)
            kind = f"{kind} adapter-host"
        else:
            total = sum(device.slots for device in devices)
            used = sum(self.scheduler.slots_in_use(device) for device in devices)
        what = f"{slots} {kind} slot{'s' if slots > 1 else ''}" if slots > 1 else f"a {kind} slot"
        if exclusive:
            what = f"{slots} whole GPU{'s' if slots > 1 else ''}"
        if models and self.scheduler.models_restrict_placement(models):  # a cluster: only some hosts have it
            what += f" on a host with {', '.join(sorted(models))}"
        visible = [holder for holder in holders if self._visible(snapshot, holder, principal)]
        names = [self._name(snapshot, holder) for holder in visible]
        if len(visible) < len(holders):
            hidden = len(holders) - len(visible)
            names.append(f"{hidden} of another user" if hidden == 1 else f"{hidden} of other users")
        shown = ", ".join(names[:MAX_NAMED_HOLDERS]) + (
            f" and {len(names) - MAX_NAMED_HOLDERS} more" if len(names) > MAX_NAMED_HOLDERS else ""
        )
        reason = (
            f"waiting for {what}: {used}/{total} held by {self._kinds(snapshot, holders)} {shown}"
            if holders
            else f"waiting for {what}"
        )
        if room_reason is not None:
            reason = room_reason
        if index:
            reason = f"{index} ahead in the queue; {reason}"
        priority, effective, submitted_at = self.scheduler.priority_of(job_id)
        return {
            "position": position,
            "reason": reason,
            "blocked_by": visible,
            # Which holder's end makes room for a slot's bytes is not known: no estimate.
            "estimate_s": None
            if room_reason is not None
            else self._estimate(
                snapshot, snapshot.slots_ahead[index], slots, total - used, holders, devices, adapter
            ),
            "priority": priority,
            "effective_priority": effective,
            "submitted_at": submitted_at,
        }

    def pending_jobs(self, principal: Principal | None = None) -> list[dict[str, Any]]:
        """The pending jobs the principal may see, in queue order, for `GET /v1/capacity`."""
        snapshot = self._snapshot()
        rows = []
        for holder in self.scheduler.pending_holders():
            label = snapshot.labels.get(holder)
            if label is None or label["kind"] != "job" or not self._visible(snapshot, holder, principal):
                continue
            queue = self.for_job(holder, principal)
            if queue is not None:
                rows.append(
                    {
                        "job_id": holder,
                        "name": label.get("name"),
                        "position": queue["position"],
                        "reason": queue["reason"],
                        "estimate_s": queue["estimate_s"],
                        "priority": queue["priority"],
                        "effective_priority": queue["effective_priority"],
                    }
                )
        return rows

    def _estimate(
        self,
        snapshot: _QueueSnapshot,
        slots_ahead: int,
        slots: int,
        free: int,
        holders: list[str],
        devices,
        adapter: bool,
    ) -> float | None:
        """When enough slots free up for the jobs ahead and this one (on the same devices)."""
        needed = slots + slots_ahead - free
        if needed <= 0:
            return 0.0
        frees: list[float] = []
        for holder in holders:
            seconds = self._frees_in(snapshot, holder)
            if seconds is None:
                return None
            frees.extend([max(seconds, 0.0)] * self.scheduler.slots_held(holder, devices, adapter))
        frees.sort()
        return frees[needed - 1] if needed <= len(frees) else None

    def _frees_in(self, snapshot: _QueueSnapshot, holder: str) -> float | None:
        now = time.monotonic()
        cached = snapshot.frees_in.get(holder)
        if cached is not None and now - cached[0] < FREES_IN_TTL_S:
            return cached[1]
        seconds = self.frees_in(holder)
        snapshot.frees_in[holder] = (now, seconds)
        return seconds

    def _visible(self, snapshot: _QueueSnapshot, holder_id: str, principal: Principal | None) -> bool:
        if principal is None:
            return True
        label = snapshot.labels.get(holder_id)
        return label is not None and principal.can_see(label["owner"])

    def _name(self, snapshot: _QueueSnapshot, holder_id: str) -> str:
        label = snapshot.labels.get(holder_id) or {}
        name = label.get("name") or holder_id
        return f"{name} (freeing)" if self.scheduler.is_freeing(holder_id) else name

    def _kinds(self, snapshot: _QueueSnapshot, holders: list[str]) -> str:
        runs = sum(1 for holder in holders if (snapshot.labels.get(holder) or {}).get("kind") == "run")
        if runs == 0:
            return "job" if len(holders) == 1 else "jobs"
        if runs == len(holders):
            return "run" if runs == 1 else "runs"
        return "jobs and runs"
