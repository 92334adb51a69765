"""Sampling a job that has ended: its device is free, so a short-lived sampling job on the same base
model loads the run's checkpoint (`final`, else its latest) and answers. `keep_alive` only saves that
start; sampling what you just trained never needs it planned. The sampling itself is
`training.sample_checkpoint`; this module chooses the checkpoint and waits for the job to end."""

from __future__ import annotations

from typing import Any

from . import errors
from .api import Api
from .protocol.checkpoint_format import FINAL_CHECKPOINT
from .protocol.states import JOB_TERMINAL

# How long to wait for a job that is completing (saving `final`) before sampling its checkpoint.
COMPLETING_WAIT_S = 300.0


def sampling_checkpoint(api: Api, job: dict[str, Any]) -> str:
    """The checkpoint a finished run is sampled (and compared) with: `final` where there is one, else
    its latest."""
    ids = [row["checkpoint_id"] for row in api.list_checkpoints(job["job_id"])["checkpoints"]]
    if FINAL_CHECKPOINT in ids:
        return FINAL_CHECKPOINT
    if not ids:
        raise errors.CortexError(
            f"job {job['job_id']} is {job['status']} and saved no checkpoint, so there are no trained weights"
            " to sample; a run that ends by finishing or by job.complete() saves 'final'",
            code="checkpoint_not_found",
        )
    return ids[-1]


def ended_job(api: Api, job_id: str) -> dict[str, Any] | None:
    """The job once it has ended (waiting while it completes), or None while it still takes requests."""
    from .polling import wait_for_job

    job = api.get_job(job_id)
    if job["status"] in JOB_TERMINAL:
        return job
    try:
        job = wait_for_job(api, job_id, tuple(JOB_TERMINAL), COMPLETING_WAIT_S)
    except errors.TimeoutError:
        return None
    return job
