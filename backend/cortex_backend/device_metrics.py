"""Readers of the monitor's samples: a job's metrics (persisted, readable after the job ends) and the
host's latest sample per device (for live device bars)."""

from __future__ import annotations

from typing import Any

from .auth import Principal
from .jobs import JobManager
from .monitor import RANK_MARK, Monitor
from .store import Store

MAX_PAGE = 10_000


# Kept in storage, never shown as is: who else was on the device, and their processes.
PRIVATE_FIELDS = ("sub_jobs", "workers")


def _job_view(sample: dict[str, Any], job_id: str) -> dict[str, Any]:
    """A stored sample as the job's owner sees it: the host's CPU/RAM, attributed to this job's
    sub-jobs only, plus the CPU and RAM of this job's own worker processes where they were measured
    (`job_cpu_percent` on the host's scale, `job_ram_bytes`, all ranks of a sub-job across devices together,
    and each rank's own in `job_ranks`); absent, not zero, where they were not."""
    view = {key: value for key, value in sample.items() if key not in PRIVATE_FIELDS}
    prefix = job_id + "/"
    view["sub_job_ids"] = [
        entry[len(prefix) :] for entry in sample.get("sub_jobs", []) if entry.startswith(prefix)
    ]
    own = {
        name: reading for name, reading in (sample.get("workers") or {}).items() if name.startswith(prefix)
    }
    if own:
        view["job_cpu_percent"] = round(sum(reading["cpu_percent"] for reading in own.values()), 2)
        view["job_ram_bytes"] = sum(reading["ram_bytes"] for reading in own.values())
    ranks = [
        {"sub_job_id": sub_job_id, "rank": int(rank), **reading}
        for name, reading in own.items()
        if RANK_MARK in name
        for sub_job_id, rank in [name[len(prefix) :].split(RANK_MARK)]
    ]
    if ranks:  # a sub-job across devices: each of its ranks on this device, read on its own
        view["job_ranks"] = sorted(ranks, key=lambda entry: (entry["sub_job_id"], entry["rank"]))
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
        devices = sorted(
            {sub["device"] for sub in job["sub_jobs"] if sub["device"]}
            # every rank's device of a sub-job across devices, not rank 0's only
            | {rank["device"] for sub in job["sub_jobs"] for rank in (sub.get("info") or {}).get("ranks", [])}
        )
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
            "gpu_metrics_note": self.monitor.gpu_metrics_note,
        }

    def host(self, since: float) -> dict[str, Any]:
        """The newest sample of each device served, if newer than `since`."""
        latest = [
            {key: value for key, value in sample.items() if key not in PRIVATE_FIELDS}
            for sample in self.monitor.latest()
            if sample["at"] > since
        ]
        return {
            "samples": latest,
            "next_since": max([since, *(sample["at"] for sample in latest)]),
            "devices": [device.to_json() for device in self.monitor.devices],
            "interval_s": self.monitor.interval_s,
            "gpu_unavailable_reason": self.monitor.gpu_unavailable_reason,
            "gpu_metrics_note": self.monitor.gpu_metrics_note,
        }
