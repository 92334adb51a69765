"""Job, sub-job, request and progress states, and the one word each job state is shown with.

The failure codes they end with are in `errors.ERROR_CODES`.

One definition for the backend, the client, the widgets and (through a generated copy checked by a
test) the sidebar panel.
"""

from __future__ import annotations

# Jobs and sub-jobs: pending -> starting -> running -> done | failed | cancelled
JOB_PENDING = "pending"
JOB_STARTING = "starting"
JOB_RUNNING = "running"
JOB_DONE = "done"
JOB_FAILED = "failed"
JOB_CANCELLED = "cancelled"
JOB_STATES = (JOB_PENDING, JOB_STARTING, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED)
JOB_TERMINAL = frozenset({JOB_DONE, JOB_FAILED, JOB_CANCELLED})

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

# Which operations each sub-job type serves.
OPERATIONS_BY_TYPE: dict[str, frozenset[str]] = {
    TRAINING: frozenset({"forward_backward", "step", "generate", "forward", "save", "load", "noop"}),
    SAMPLING: frozenset({"generate", "forward", "load", "noop"}),
    LOG_PROBABILITY: frozenset({"forward", "load", "noop"}),
}

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
DISPLAY_WORDS = (
    WORD_QUEUED,
    WORD_STARTING,
    WORD_TRAINING,
    WORD_SAMPLING,
    WORD_IDLE,
    WORD_DONE,
    WORD_FAILED,
    WORD_CANCELLED,
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
    return WORD_DONE, None
