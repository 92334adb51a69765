"""Job, sub-job, request and progress states, and the one word each job state is shown with.

The failure codes they end with are in `errors.ERROR_CODES`.

One definition for the backend, the client, the widgets and (through a generated copy checked by a
test) the sidebar panel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Jobs and sub-jobs: pending -> starting -> running -> done | failed | cancelled
JOB_PENDING = "pending"
JOB_STARTING = "starting"
JOB_RUNNING = "running"
JOB_DONE = "done"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_STATES = (JOB_PENDING, JOB_STARTING, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED)
JOB_TERMINAL = frozenset({JOB_DONE, JOB_FAILED, JOB_CANCELLED})

# The label that marks the short-lived jobs `%cortex compare` and sampling on demand start: listings (the
# sidebar's runs) hide them by default, as they are the tool's own, not the user's runs.
PURPOSE_LABEL = "purpose"
SHORT_LIVED_PURPOSES = ("compare", "sample")
SHORT_LIVED = {purpose: {PURPOSE_LABEL: purpose} for purpose in SHORT_LIVED_PURPOSES}


# The label a job's first live widget records its display id in (the cell that showed it first): after a
# kernel restart, the widget that reattaches the run elsewhere rewrites that cell's record to say where
# the run went, and at its end, the final picture.
CELL_DISPLAY_LABEL = "cell_display"
# Labels the tool keeps for itself: listings and the sidebar do not show them as tags, and editing a job's tags
# keeps them.
INTERNAL_LABELS = (CELL_DISPLAY_LABEL,)


def user_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """A job's labels as its tags: without the ones the tool keeps for itself."""
    return {key: value for key, value in (labels or {}).items() if key not in INTERNAL_LABELS}


def is_short_lived(job: Mapping[str, Any]) -> bool:
    """A job `%cortex compare` or sampling on demand started for itself (listings hide it by default)."""
    return (job.get("labels") or {}).get(PURPOSE_LABEL) in SHORT_LIVED_PURPOSES


# Data-plane requests: queued -> running -> succeeded | failed | cancelled
REQUEST_QUEUED = "queued"
REQUEST_RUNNING = "running"
REQUEST_SUCCEEDED = "succeeded"
REQUEST_FAILED = "failed"
REQUEST_CANCELLED = "cancelled"
REQUEST_STATES = (REQUEST_QUEUED, REQUEST_RUNNING, REQUEST_SUCCEEDED, REQUEST_FAILED, REQUEST_CANCELLED)
REQUEST_TERMINAL = frozenset({REQUEST_SUCCEEDED, REQUEST_FAILED, REQUEST_CANCELLED})

# Sub-job types
TRAINING = "training"
SAMPLING = "sampling"
LOG_PROBABILITY = "log_probability"
SUB_JOB_TYPES = (TRAINING, SAMPLING, LOG_PROBABILITY)

# Progress records (GET /v1/jobs/{id} -> "progress"): who drives the training, and where it is.
PROGRESS_MANAGED = "managed"  # the training worker runs the loop of a `training_loop` spec
PROGRESS_PRIMITIVE = "primitive"  # folded from a client's own forward_backward / step results
PHASE_WAITING = "waiting"
PHASE_TRAINING = "training"
PHASE_KEEP_ALIVE = "keep_alive"
PHASE_FINISHED = "finished"
PHASE_STOPPED = "stopped"
PHASE_FAILED = "failed"
PROGRESS_PHASES = (
    PHASE_WAITING,
    PHASE_TRAINING,
    PHASE_KEEP_ALIVE,
    PHASE_FINISHED,
    PHASE_STOPPED,
    PHASE_FAILED,
)

# One word per state, everywhere a job is shown (the widget, %cortex jobs / status, the sidebar).
WORD_QUEUED = "queued"
WORD_STARTING = "starting"
WORD_TRAINING = "training"
WORD_SAMPLING = "sampling"  # running, and serving requests (a keep-alive after training, or a sampler)
WORD_IDLE = "idle"  # running with nothing to do: the backend frees its device at `idle.frees_at`
WORD_DONE = "done"
WORD_FAILED = "failed"
WORD_CANCELLED = "cancelled"
# done, but its training was stopped before its planned steps ("stopped at 831/3000 (checkpoint final)")
WORD_STOPPED = "stopped"
DISPLAY_WORDS = (
    WORD_QUEUED,
    WORD_STARTING,
    WORD_TRAINING,
    WORD_SAMPLING,
    WORD_IDLE,
    WORD_DONE,
    WORD_FAILED,
    WORD_CANCELLED,
    WORD_STOPPED,
)


def clock(seconds: float) -> str:
    """A duration as m:ss (or h:mm:ss): how the views write ETAs and countdowns."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def display_state(job: dict, now: float | None = None) -> tuple[str, str | None]:
    """The word for a job (one of `DISPLAY_WORDS`) and an optional detail, from the backend's job JSON.

    The sidebar's generated contract carries the same function (scripts/generate_contract.py).
    """
    import time

    now = time.time() if now is None else now
    status = job.get("status")
    progress = job.get("progress") or {}
    if status == JOB_PENDING:
        queue = job.get("queue") or {}
        detail = None
        if queue.get("reason"):
            detail = f"#{queue.get('position')} in the queue: {queue['reason']}"
            if queue.get("estimate_s") is not None:
                detail += f" (about {clock(queue['estimate_s'])})"
        return WORD_QUEUED, detail
    if status == JOB_STARTING:
        return WORD_STARTING, None
    if status == JOB_RUNNING:
        phase = progress.get("phase")
        if phase == PHASE_TRAINING and progress.get("source") == PROGRESS_MANAGED:
            total = progress.get("total_steps")
            return WORD_TRAINING, f"step {progress.get('step', 0)}" + (f"/{total}" if total else "")
        if phase == PHASE_KEEP_ALIVE:
            until = job.get("keep_alive_until")
            return WORD_SAMPLING, (
                f"keep-alive, freeing the device in {clock(until - now)}" if until else "keep-alive"
            )
        idle = job.get("idle")
        if idle:
            return WORD_IDLE, f"freeing the device in {clock(idle['frees_at'] - now)}"
        trains = any(sub.get("type") == TRAINING for sub in job.get("sub_jobs") or [])
        return (
            (WORD_TRAINING, f"step {progress['step']}" if progress.get("step") else None)
            if trains
            else (WORD_SAMPLING, None)
        )
    if status == JOB_FAILED:
        code, message = job.get("failure_code"), job.get("failure_message")
        return WORD_FAILED, (f"{code}: {message}" if message else code) if code else message
    if status == JOB_CANCELLED:
        return WORD_CANCELLED, None
    total = progress.get("total_steps")
    if progress.get("phase") == PHASE_STOPPED and total and (progress.get("step") or 0) < total:
        checkpoint = progress.get("last_checkpoint")
        return WORD_STOPPED, f"at {progress.get('step') or 0}/{total}" + (
            f" (checkpoint {checkpoint})" if checkpoint else ""
        )
    return WORD_DONE, None


# How every view writes the progress record's numbers (the sidebar's generated contract carries twins):
# one field, one format, so the widget and the sidebar show the same text for the same record.
def format_loss(value: float | None) -> str:
    """Four significant digits, written as JavaScript writes `Number(v.toPrecision(4))` ("0.0002457",
    "1.234", "12350"); "–" when there is none. Small losses never read 0.0000."""
    import math
    import re
    from decimal import Decimal

    if value is None or not math.isfinite(value):
        return "–"
    rounded = float(f"{value:.4g}")
    if rounded == 0 or 1e-6 <= abs(rounded) < 1e21:
        text = format(Decimal(repr(rounded)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{rounded:.4g}")


def format_rate(value: float | None, unit: str) -> str:
    """A rate with a unit: "2.7k tok/s", "652 tok/s", "3.1 steps/s"; '' when unknown."""
    import math

    if value is None or not math.isfinite(value):
        return ""
    if value >= 1000:
        return f"{value / 1000:.1f}k {unit}"
    return f"{value:.0f} {unit}" if value >= 10 else f"{value:.1f} {unit}"


def format_bytes(value: float | None) -> str:
    """Binary units: "512 B", "1.5 GiB", "120 GiB"; "–" when unknown."""
    import math

    if value is None or not math.isfinite(value):
        return "–"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} {units[unit]}" if value >= 100 or unit == 0 else f"{value:.1f} {units[unit]}"


def progress_timing(progress: dict | None) -> str:
    """ "ETA 0:18 · 2.1k tok/s" while training, "took 0:49 · 2.1k tok/s" after, from the record only."""
    if not progress:
        return ""
    training = progress.get("phase") == PHASE_TRAINING
    parts = [
        f"ETA {clock(progress['eta_s'])}" if training and progress.get("eta_s") is not None else "",
        f"took {clock(progress['elapsed_s'])}"
        if not training and progress.get("elapsed_s") is not None
        else "",
        format_rate(progress.get("tokens_per_s"), "tok/s"),
    ]
    return " · ".join(part for part in parts if part)
