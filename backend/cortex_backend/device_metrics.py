"""Readers of the monitor's samples: a job's metrics (persisted, readable after the job ends) and the
host's latest sample per device (for live device bars)."""

from __future__ import annotations

from typing import Any

from .auth import Principal
from .jobs import JobManager
from .monitor import Monitor
from .store import Store

MAX_PAGE = 10_000


def _job_view(sample: dict[str, Any], job_id: str) -> dict[str, Any]:
    """A stored sample as the job's owner sees it: attributed to this job's sub-jobs only."""
    view = {key: value for key, value in sample.items() if key != "sub_jobs"}
    prefix = job_id + "/"
    view["sub_job_ids"] = [entry[len(prefix):] for entry in sample.get("sub_jobs", []) if entry.startswith(prefix)]
    return view


class DeviceMetrics:
    def __init__(self, store: Store, jobs: JobManager, monitor: Monitor) -> None:
        self.store = store
        self.jobs = jobs
        self.monitor = monitor

    def for_job(self, principal: Principal, job_id: str, since: float, limit: int) -> dict[str, Any]:
        """Samples of the devices the job's sub-jobs ran on, within its lifetime, after `since`.

        A page never splits one tick (samples of several devices share an `at`), so paging by
        `next_since` loses nothing.
        """
        job = self.jobs.visible_job(principal, job_id)
        limit = max(1, min(limit, MAX_PAGE))
        devices = sorted({sub["device"] for sub in job["sub_jobs"] if sub["device"]})
        samples: list[dict[str, Any]] = []
        if job["started_at"] is not None and devices:
            after = max(since, job["started_at"])
            rows = self.store.device_samples(devices, after, job["finished_at"], limit + 1)
            if len(rows) > limit:
                boundary = rows[limit]["at"]
                rows = [row for row in rows[:limit] if row["at"] != boundary]
                if not rows:  # one tick holds more samples than `limit`: return that whole tick
                    rows = self.store.device_samples(devices, after, boundary, MAX_PAGE)
            samples = [_job_view(row, job_id) for row in rows]
        return {
            "samples": samples,
            "next_since": float(samples[-1]["at"]) if samples else float(since),
            "devices": devices,
            "interval_s": self.monitor.interval_s,
            "gpu_unavailable_reason": self.monitor.gpu_unavailable_reason,
        }

    def host(self, since: float) -> dict[str, Any]:
        """The newest sample of each device served, if newer than `since`."""
        latest = [
            {key: value for key, value in sample.items() if key != "sub_jobs"}
            for sample in self.monitor.latest()
            if sample["at"] > since
        ]
        return {
            "samples": latest,
            "next_since": max([since, *(sample["at"] for sample in latest)]),
            "devices": [device.to_json() for device in self.monitor.devices],
            "interval_s": self.monitor.interval_s,
            "gpu_unavailable_reason": self.monitor.gpu_unavailable_reason,
        }
