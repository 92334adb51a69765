"""What a job view shows, kept bounded: a long run never grows the kernel's memory.

`JobState` is written by a background feed that reads the backend: the job's JSON with its progress
record (step, loss per token, eval loss, samples, ETA: the backend computes them, the view never
recomputes), the log tail and device samples. The widget's renderer and the non-interactive printer
read it. Chart series are the backend's bounded history, the log tail is a capped deque, and only the
latest samples are kept.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .protocol.series import CHART_POINTS, DecimatedSeries
from .protocol.states import (
    JOB_TERMINAL,
    WORD_CANCELLED,
    WORD_DONE,
    WORD_FAILED,
    WORD_STOPPED,
    clock,
    display_state,
    format_loss,
    format_rate,
)

METRIC_POINTS = 240
LOG_TAIL_LINES = 200
LOG_LINE_CHARS = 400
SAMPLE_CHARS = 300
MAX_SAMPLES = 8
# The display words a finished job shows.
TERMINAL_WORDS = frozenset({WORD_DONE, WORD_FAILED, WORD_CANCELLED, WORD_STOPPED})
BACKEND_GONE = "backend gone"


def resumed_text(resumed: dict[str, Any]) -> str:
    """The line a view shows for a run resumed after a backend restart (its progress's `resumed`)."""
    where = (
        f"from checkpoint {resumed['checkpoint_id']}" if resumed.get("checkpoint_id") else "from the start"
    )
    lost = int(resumed.get("lost_steps") or 0)
    return f"the backend restarted: resumed {where} at step {resumed['step']}; " + (
        f"{lost} step(s) lost, trained again" if lost else "no step lost"
    )


@dataclass
class Snapshot:
    """A consistent copy of a `JobState` for one render."""

    job_id: str
    name: str | None
    model: str | None
    devices: list[str]
    # The one word for the job's state (`cortex_nb.protocol.states.display_state`) and its detail, e.g.
    # ("queued", "#2 in the queue: waiting for a cpu slot: 4/4 held by jobs q0, q1, q2, q3").
    status: str
    detail: str | None
    job_status: str | None
    message: str | None
    backend_gone: bool
    step: int
    total_steps: int | None
    steps_per_s: float | None
    tokens_per_s: float | None
    eta_s: float | None
    elapsed_s: float | None
    last_loss: float | None
    first_loss: float | None
    last_eval: float | None
    loss: list[tuple[float, float]]
    eval_loss: list[tuple[float, float]]
    metric_kind: str | None
    metrics: dict[str, list[tuple[float, float]]]
    metrics_note: str | None
    metrics_device: str | None
    log_tail: list[str]
    logs_dropped: int
    samples_step: int | None
    samples: list[tuple[str, str]]
    checkpoints: list[str] = field(default_factory=list)
    # RL losses: mean |sampler logprob - trainer logprob| per step (the progress record's curve).
    mismatch: list[tuple[float, float]] = field(default_factory=list)
    last_mismatch_max: float | None = None
    queue: dict[str, Any] | None = None
    idle: dict[str, Any] | None = None
    # The last job JSON as the backend sent it (progress, queue, idle, ...); {} before the first.
    job: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_WORDS


class JobState:
    """Thread-safe, bounded record of one job as the backend reports it."""

    def __init__(self, job_id: str, name: str | None = None, model: str | None = None) -> None:
        self.job_id = job_id
        self.name = name
        self.model = model
        self.devices: list[str] = []
        self.job: dict[str, Any] = {"job_id": job_id, "status": None}
        self.job_status: str | None = None
        self.message: str | None = None
        self.backend_gone = False
        # Set by a view while it shows the log tail: the feed then reads new lines every 2 s, else every 15 s.
        self.logs_open = False
        self.progress: dict[str, Any] = {}
        self.loss = DecimatedSeries(CHART_POINTS)
        self.eval_loss = DecimatedSeries(CHART_POINTS)
        self.mismatch = DecimatedSeries(CHART_POINTS)
        self.metric_kind: str | None = None
        self.metrics: dict[str, DecimatedSeries] = {}
        self.metrics_note: str | None = None
        self.metrics_origin: float | None = None
        self.metrics_device: str | None = None
        self.log_tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.logs_dropped = 0
        self.samples_step: int | None = None
        self.samples: list[tuple[str, str]] = []
        self.checkpoints: deque[str] = deque(maxlen=MAX_SAMPLES)
        self._resumed_seen: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._listeners: list[Callable[[], None]] = []

    # listeners ----------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    # writers -------------------------------------------------------------------------------------
    def set_job(self, job: dict[str, Any]) -> None:
        """Take what the backend says about the job: status, model, devices, failure, and its
        progress record, queue place and idle countdown when the answer carries them."""
        with self._lock:
            if "progress" not in job and self.progress:
                # An answer without the record (cancel, complete) keeps the one held: the header's
                # step and the progress line's step come from one record, never two.
                job = {**job, "progress": self.progress}
            self.job = job
            self.job_status = job.get("status")
            if self.backend_gone and (self.message or "").startswith(BACKEND_GONE):
                self.message = None  # it answers again
            self.backend_gone = False
            self.name = job.get("name") or self.name
            subs = job.get("sub_jobs") or []
            if subs:
                self.model = subs[0].get("base_model") or self.model
                self.devices = sorted({sub["device"] for sub in subs if sub.get("device")})
            if job.get("failure_code") and self.job_status in JOB_TERMINAL:
                self.message = f"{job['failure_code']}: {job.get('failure_message') or ''}".strip(": ")
            if "progress" in job:
                self._take_progress(job.get("progress") or {})
        self._changed()

    def _take_progress(self, progress: dict[str, Any]) -> None:
        """The backend's record replaces the curves (it keeps them bounded and decimated already)."""
        if progress.get("updated_at") == self.progress.get("updated_at") and progress:
            return
        self.progress = progress
        self.loss = _series(progress.get("history") or [], "loss_per_token")
        self.eval_loss = _series(progress.get("eval_history") or [], "eval_loss_per_token")
        self.mismatch = _series(progress.get("mismatch_history") or [], "sampler_mismatch_mean")
        samples = progress.get("samples")
        if samples:
            self.samples_step = samples.get("step")
            self.samples = [
                (item["prompt"][:SAMPLE_CHARS], (item.get("text") or "")[:SAMPLE_CHARS])
                for item in samples.get("items", [])[:MAX_SAMPLES]
            ]
        resumed = progress.get("resumed")
        if resumed and resumed != (self._resumed_seen or None):
            self._resumed_seen = resumed
            self.message = resumed_text(resumed)
        checkpoint = progress.get("last_checkpoint")
        if checkpoint and (not self.checkpoints or self.checkpoints[-1] != checkpoint):
            self.checkpoints.append(checkpoint)

    def set_backend_gone(self, reason: str) -> None:
        """The backend does not answer: views say so instead of showing a state that may be stale."""
        with self._lock:
            self.backend_gone = True
            self.message = f"{BACKEND_GONE}: {reason}"
        self._changed()

    def note(self, message: str) -> None:
        """A line the view shows under the header (a failure, or why something is missing)."""
        with self._lock:
            self.message = message
        self._changed()

    def record_checkpoint(self, checkpoint_id: str) -> None:
        """A checkpoint this view asked for (the Save button), before the next progress update."""
        with self._lock:
            self.checkpoints.append(checkpoint_id)
        self._changed()

    def add_log_lines(self, lines: Iterable[str], dropped: int = 0) -> None:
        with self._lock:
            for line in lines:
                self.log_tail.append(
                    line if len(line) <= LOG_LINE_CHARS else line[: LOG_LINE_CHARS - 1] + "…"
                )
            self.logs_dropped += dropped
        self._changed()

    def add_metrics(self, samples: Iterable[dict[str, Any]], note: str | None = None) -> None:
        """Device samples (GET /v1/jobs/{id}/metrics): GPU fields when present, else CPU/RAM."""
        with self._lock:
            if note:
                self.metrics_note = note
            for sample in samples:
                # One device on the chart: the first the job's samples name (its trainer's, as a rule).
                self.metrics_device = self.metrics_device or sample.get("device")
                if sample.get("device") != self.metrics_device:
                    continue
                at = float(sample.get("at") or time.time())
                if self.metrics_origin is None:
                    self.metrics_origin = at
                x = at - self.metrics_origin
                if sample.get("gpu_utilization_percent") is not None:
                    self.metric_kind = "gpu"
                    self._metric("gpu_utilization_percent").append(
                        x, float(sample["gpu_utilization_percent"])
                    )
                    used, total = sample.get("gpu_memory_used_bytes"), sample.get("gpu_memory_total_bytes")
                    if used is not None and total:
                        self._metric("gpu_memory_percent").append(x, 100.0 * used / total)
                elif self.metric_kind != "gpu":
                    self.metric_kind = "cpu"
                    if sample.get("cpu_percent") is not None:
                        self._metric("cpu_percent").append(x, float(sample["cpu_percent"]))
                    used, total = sample.get("ram_used_bytes"), sample.get("ram_total_bytes")
                    if used is not None and total:
                        self._metric("ram_percent").append(x, 100.0 * used / total)
                    # The job's own worker processes, where the backend could attribute them.
                    if sample.get("job_cpu_percent") is not None:
                        self._metric("job_cpu_percent").append(x, float(sample["job_cpu_percent"]))
                    if sample.get("job_ram_bytes") is not None and total:
                        self._metric("job_ram_percent").append(x, 100.0 * sample["job_ram_bytes"] / total)
        self._changed()

    def _metric(self, name: str) -> DecimatedSeries:
        if name not in self.metrics:
            self.metrics[name] = DecimatedSeries(METRIC_POINTS)
        return self.metrics[name]

    # readers -------------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(self.progress.get("step") or 0)

    @property
    def total_steps(self) -> int | None:
        return self.progress.get("total_steps")

    @property
    def status(self) -> str:
        """The job's display word (`cortex_nb.protocol.states.display_state`)."""
        with self._lock:
            return display_state(self.job)[0] if self.job.get("status") else "starting"

    @property
    def finished(self) -> bool:
        return self.job_status in JOB_TERMINAL

    def snapshot(self) -> Snapshot:
        with self._lock:
            progress = self.progress
            word, detail = display_state(self.job) if self.job.get("status") else ("starting", None)
            return Snapshot(
                job_id=self.job_id,
                name=self.name,
                model=self.model,
                devices=list(self.devices),
                status=word,
                detail=detail,
                job_status=self.job_status,
                message=self.message,
                backend_gone=self.backend_gone,
                step=self.step,
                total_steps=self.total_steps,
                steps_per_s=progress.get("steps_per_s"),
                tokens_per_s=progress.get("tokens_per_s"),
                eta_s=progress.get("eta_s"),
                elapsed_s=progress.get("elapsed_s"),
                last_loss=progress.get("loss_per_token"),
                first_loss=self.loss.first[1] if self.loss.first else None,
                last_eval=progress.get("eval_loss_per_token"),
                loss=self.loss.points(),
                eval_loss=self.eval_loss.points(),
                metric_kind=self.metric_kind,
                metrics={name: series.points() for name, series in self.metrics.items()},
                metrics_note=self.metrics_note,
                metrics_device=self.metrics_device,
                log_tail=list(self.log_tail),
                logs_dropped=self.logs_dropped,
                samples_step=self.samples_step,
                samples=list(self.samples),
                checkpoints=list(self.checkpoints),
                mismatch=self.mismatch.points(),
                last_mismatch_max=progress.get("sampler_mismatch_max"),
                queue=self.job.get("queue"),
                idle=self.job.get("idle"),
                job=dict(self.job),
            )

    def retained_sizes(self) -> dict[str, int]:
        """How much this state holds (bounded whatever the run length)."""
        with self._lock:
            sizes = {
                "loss_points": len(self.loss),
                "eval_points": len(self.eval_loss),
                "log_lines": len(self.log_tail),
                "samples": len(self.samples),
                "checkpoints": len(self.checkpoints),
            }
            sizes["metric_points"] = sum(len(series) for series in self.metrics.values())
            return sizes

    def progress_line(self) -> str:
        """One compact line: where the run is now."""
        snap = self.snapshot()
        total = f"/{snap.total_steps}" if snap.total_steps else ""
        parts = [f"{snap.job_id} step {snap.step}{total}"]
        if snap.last_loss is not None:
            parts.append(f"loss per token {format_loss(snap.last_loss)}")
        if snap.last_eval is not None:
            parts.append(f"eval loss per token {format_loss(snap.last_eval)}")
        if snap.mismatch:
            parts.append(f"sampler mismatch {format_loss(snap.mismatch[-1][1])}")
        if snap.tokens_per_s:
            parts.append(f"{format_count(snap.tokens_per_s)} tok/s")
        if snap.eta_s is not None:
            parts.append(f"ETA {format_duration(snap.eta_s)}")
        return "  ".join(parts)

    def summary(self) -> str:
        """The final line: state, steps, loss per token first -> last, eval, speed."""
        snap = self.snapshot()
        total = f"/{snap.total_steps}" if snap.total_steps else ""
        text = f"{snap.job_id} ({snap.model or '?'}) {snap.status}: {snap.step}{total} steps"
        if snap.elapsed_s is not None:
            text += f" in {format_duration(snap.elapsed_s)}"
        if snap.first_loss is not None and snap.last_loss is not None:
            text += f", loss per token {format_loss(snap.first_loss)} -> {format_loss(snap.last_loss)}"
        if snap.last_eval is not None:
            text += f", eval loss per token {format_loss(snap.last_eval)}"
        if snap.tokens_per_s:
            text += f", {format_count(snap.tokens_per_s)} tok/s"
        if snap.message and snap.status != WORD_DONE:
            text += f" ({snap.message})"
        elif snap.detail and snap.status != WORD_DONE:
            text += f" ({snap.detail})"
        return text


def _series(points: list[dict[str, Any]], key: str) -> DecimatedSeries:
    # Room for every point the backend sends (it already decimated them): none is merged again here.
    series = DecimatedSeries(2 * CHART_POINTS + 2)
    for point in points:
        if point.get(key) is not None:
            series.append(float(point["step"]), float(point[key]))
    return series


def format_duration(seconds: float) -> str:
    return clock(seconds)


def format_count(value: float) -> str:
    """A rate's number as the sidebar writes it ("1.7k", "652")."""
    return format_rate(value, "").strip()
