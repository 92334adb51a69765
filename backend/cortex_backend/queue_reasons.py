"""Why a job waits: its place in the queue, who holds the device slots it needs, and when one may free.

An estimate comes from what the backend knows of each holder: a managed run's ETA, an idle job's
`frees_at`, a keep-alive's end. A holder busy with a client's own requests could end at any time, so
when the slots a job waits for depend on such holders there is no estimate (null), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .auth import Principal
from .scheduler import Scheduler
from .store import Store

MAX_NAMED_HOLDERS = 5


class QueueReasons:
    def __init__(self, store: Store, scheduler: Scheduler, frees_in: Callable[[str], float | None]) -> None:
        """`frees_in(holder_id)`: seconds until a holder frees its slots, None when unknown."""
        self.store = store
        self.scheduler = scheduler
        self.frees_in = frees_in

    def for_job(self, job_id: str, principal: Principal | None = None) -> dict[str, Any] | None:
        """`{position, reason, blocked_by, estimate_s}` for a pending job; None for any other. Holders the
        principal may not see are counted, never named."""
        pending = self.scheduler.pending_holders()
        if job_id not in pending:
            return None
        position = pending.index(job_id) + 1
        slots, min_memory, exclusive = self.scheduler.request_of(job_id)
        models = self.scheduler.models_of(job_id)
        devices = self.scheduler.eligible_devices(min_memory, exclusive, models)
        holders = self.scheduler.holders_on(devices)
        total = sum(device.slots for device in devices)
        used = sum(self.scheduler.slots_in_use(device) for device in devices)
        kind = "/".join(sorted({device.kind for device in devices})) or "device"
        what = f"{slots} {kind} slot{'s' if slots > 1 else ''}" if slots > 1 else f"a {kind} slot"
        if exclusive:
            what = f"{slots} whole GPU{'s' if slots > 1 else ''}"
        if models and self.scheduler.models_restrict_placement(models):  # a cluster: only some hosts have it
            what += f" on a host with {', '.join(sorted(models))}"
        visible = [holder for holder in holders if self._visible(holder, principal)]
        names = [self._name(holder) for holder in visible]
        if len(visible) < len(holders):
            hidden = len(holders) - len(visible)
            names.append(f"{hidden} of another user" if hidden == 1 else f"{hidden} of other users")
        shown = ", ".join(names[:MAX_NAMED_HOLDERS]) + (
            f" and {len(names) - MAX_NAMED_HOLDERS} more" if len(names) > MAX_NAMED_HOLDERS else ""
        )
        reason = (
            f"waiting for {what}: {used}/{total} held by {self._kinds(holders)} {shown}"
            if holders
            else f"waiting for {what}"
        )
        ahead = pending[: position - 1]
        if ahead:
            reason = f"{len(ahead)} ahead in the queue; {reason}"
        return {
            "position": position,
            "reason": reason,
            "blocked_by": visible,
            "estimate_s": self._estimate(ahead, slots, total - used, holders, devices),
        }

    def pending_jobs(self, principal: Principal | None = None) -> list[dict[str, Any]]:
        """The pending jobs the principal may see, in queue order, for `GET /v1/capacity`."""
        rows = []
        for holder in self.scheduler.pending_holders():
            job = self.store.get_job(holder)
            queue = (
                self.for_job(holder, principal)
                if job is not None and self._visible(holder, principal)
                else None
            )
            if queue is not None:
                rows.append(
                    {
                        "job_id": holder,
                        "name": job.get("name"),
                        "position": queue["position"],
                        "reason": queue["reason"],
                        "estimate_s": queue["estimate_s"],
                    }
                )
        return rows

    def _estimate(self, ahead: list[str], slots: int, free: int, holders: list[str], devices) -> float | None:
        """When enough slots free up for the jobs ahead and this one (on the same devices)."""
        needed = slots + sum((self.scheduler.request_of(h) or (0, 0, False))[0] for h in ahead) - free
        if needed <= 0:
            return 0.0
        frees: list[float] = []
        for holder in holders:
            seconds = self.frees_in(holder)
            if seconds is None:
                return None
            frees.extend([max(seconds, 0.0)] * self.scheduler.slots_held(holder, devices))
        frees.sort()
        return frees[needed - 1] if needed <= len(frees) else None

    def _visible(self, holder_id: str, principal: Principal | None) -> bool:
        if principal is None:
            return True
        row = self.store.get_job(holder_id) or self.store.get_run(holder_id)
        return row is not None and principal.can_see(row["owner"])

    def _name(self, holder_id: str) -> str:
        job = self.store.get_job(holder_id)
        if job is not None:
            return job.get("name") or holder_id
        run = self.store.get_run(holder_id)
        return (run or {}).get("name") or holder_id

    def _kinds(self, holders: list[str]) -> str:
        runs = sum(1 for holder in holders if self.store.get_job(holder) is None)
        if runs == 0:
            return "job" if len(holders) == 1 else "jobs"
        if runs == len(holders):
            return "run" if runs == 1 else "runs"
        return "jobs and runs"
