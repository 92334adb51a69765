"""What a job view shows, kept bounded: a long run never grows the kernel's memory.

`JobState` is written by background threads (the training loop, the backend feed) and read by the
widget's renderer and the non-interactive printer. Chart series decimate themselves, the log tail
is a capped deque, and only the latest samples are kept.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..states import JOB_TERMINAL

CHART_POINTS = 256
METRIC_POINTS = 240
LOG_TAIL_LINES = 200
LOG_LINE_CHARS = 400
SAMPLE_CHARS = 300
MAX_SAMPLES = 8
RATE_WINDOW = 20

# What a training loop in this kernel reports; None means no loop here drives the job.
RUN_STARTING = "starting"
RUN_TRAINING = "training"
RUN_DONE = "done"
RUN_FAILED = "failed"
RUN_CANCELLED = "cancelled"
RUN_STOPPED = "stopped"
RUN_TERMINAL = frozenset({RUN_DONE, RUN_FAILED, RUN_CANCELLED, RUN_STOPPED})


class DecimatedSeries:
    """At most `capacity` (x, y) points. When full, neighbours merge pairwise (averaged) and later
    points are averaged over the doubled stride, so a long run keeps its shape in bounded memory.
    The very first point is kept as recorded."""

    def __init__(self, capacity: int = CHART_POINTS) -> None:
        self.capacity = max(4, capacity - capacity % 2)
        self.stride = 1
        self._points: list[tuple[float, float]] = []
        # The partial bucket as running sums (a list would grow with the stride).
        self._bucket_x = self._bucket_y = 0.0
        self._bucket_n = 0
        self.count = 0
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None

    def append(self, x: float, y: float) -> None:
        self.count += 1
        self.first = self.first or (x, y)
        self.last = (x, y)
        self._bucket_x += x
        self._bucket_y += y
        self._bucket_n += 1
        if self._bucket_n >= self.stride:
            self._points.append(self._bucket_mean())
            self._bucket_x = self._bucket_y = 0.0
            self._bucket_n = 0
        if len(self._points) >= self.capacity:
            # The first point stays as it was: where a curve starts (the initial loss) matters most.
            head, rest = self._points[0], self._points[1:]
            self._points = [head] + [_mean(rest[i : i + 2]) for i in range(0, len(rest), 2)]
            self.stride *= 2

    def _bucket_mean(self) -> tuple[float, float]:
        return (self._bucket_x / self._bucket_n, self._bucket_y / self._bucket_n)

    def points(self) -> list[tuple[float, float]]:
        """The retained points, plus the partial bucket so the newest value always shows."""
        return self._points + ([self._bucket_mean()] if self._bucket_n else [])

    def __len__(self) -> int:
        """Points held (the partial bucket counts as one: it is two sums and a count)."""
        return len(self._points) + (1 if self._bucket_n else 0)


def _mean(points: list[tuple[float, float]]) -> tuple[float, float]:
    return (sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points))


@dataclass
class Snapshot:
    """A consistent copy of a `JobState` for one render."""

    job_id: str
    name: str | None
    model: str | None
    devices: list[str]
    status: str
    job_status: str | None
    run_status: str | None
    message: str | None
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
    # The last job JSON as the backend sent it (progress, queue, idle, ...); {} before the first.
    job: dict[str, Any] = field(default_factory=dict)


class JobState:
    """Thread-safe, bounded record of one job as seen from this kernel."""

    def __init__(self, job_id: str, name: str | None = None, model: str | None = None) -> None:
        self.job_id = job_id
        self.name = name
        self.model = model
        self.devices: list[str] = []
        self.job: dict[str, Any] = {}
        self.job_status: str | None = None
        self.run_status: str | None = None
        self.message: str | None = None
        self.step = 0
        self.total_steps: int | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.loss = DecimatedSeries(CHART_POINTS)
        self.eval_loss = DecimatedSeries(CHART_POINTS)
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
        self._rate: deque[tuple[float, int, int]] = deque(maxlen=RATE_WINDOW + 1)
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
        """Take what the backend says about the job: status, model, devices, failure."""
        with self._lock:
            self.job = dict(job)
            self.job_status = job.get("status")
            self.name = job.get("name") or self.name
            subs = job.get("sub_jobs") or []
            if subs:
                self.model = subs[0].get("base_model") or self.model
                self.devices = sorted({sub["device"] for sub in subs if sub.get("device")})
            if job.get("failure_code") and self.job_status in JOB_TERMINAL:
                self.message = f"{job['failure_code']}: {job.get('failure_message') or ''}".strip(": ")
        self._changed()

    def set_run_status(self, status: str, message: str | None = None) -> None:
        with self._lock:
            self.run_status = status
            if message is not None:
                self.message = message
            if status == RUN_TRAINING and self.started_at is None:
                self.started_at = time.time()
            if status in RUN_TERMINAL:
                self.finished_at = time.time()
        self._changed()

    def note(self, message: str) -> None:
        """A line the view shows under the header (a failure, or why something is missing)."""
        with self._lock:
            self.message = message
        self._changed()

    def set_plan(self, total_steps: int | None) -> None:
        with self._lock:
            self.total_steps = total_steps
        self._changed()

    def record_step(self, step: int, loss: float | None, tokens: int = 0, at: float | None = None) -> None:
        at = time.time() if at is None else at
        with self._lock:
            self.step = max(self.step, step)
            if loss is not None:
                self.loss.append(step, loss)
            if self._rate:
                tokens += self._rate[-1][2]
            self._rate.append((at, step, tokens))
        self._changed()

    def record_eval(self, step: int, loss: float) -> None:
        with self._lock:
            self.eval_loss.append(step, loss)
        self._changed()

    def record_samples(self, step: int, pairs: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            self.samples_step = step
            self.samples = [(prompt[:SAMPLE_CHARS], text[:SAMPLE_CHARS]) for prompt, text in list(pairs)[:MAX_SAMPLES]]
        self._changed()

    def record_checkpoint(self, checkpoint_id: str) -> None:
        with self._lock:
            self.checkpoints.append(checkpoint_id)
        self._changed()

    def add_log_lines(self, lines: Iterable[str], dropped: int = 0) -> None:
        with self._lock:
            for line in lines:
                self.log_tail.append(line if len(line) <= LOG_LINE_CHARS else line[: LOG_LINE_CHARS - 1] + "…")
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
                    self._metric("gpu_utilization_percent").append(x, float(sample["gpu_utilization_percent"]))
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
    def status(self) -> str:
        """The loop's state while one runs here (or ended here), else the backend's job status."""
        if self.job_status in JOB_TERMINAL and self.run_status not in RUN_TERMINAL:
            return self.job_status
        return self.run_status or self.job_status or "pending"

    @property
    def finished(self) -> bool:
        return self.run_status in RUN_TERMINAL or self.job_status in JOB_TERMINAL

    def rates(self) -> tuple[float | None, float | None]:
        """(steps/s, tokens/s) over the last few steps."""
        with self._lock:
            if len(self._rate) < 2:
                return None, None
            (t0, s0, k0), (t1, s1, k1) = self._rate[0], self._rate[-1]
        if t1 <= t0:
            return None, None
        return (s1 - s0) / (t1 - t0), ((k1 - k0) / (t1 - t0)) if k1 > k0 else None

    def snapshot(self) -> Snapshot:
        steps_per_s, tokens_per_s = self.rates()
        with self._lock:
            eta = None
            if self.total_steps and steps_per_s and self.run_status == RUN_TRAINING:
                eta = max(self.total_steps - self.step, 0) / steps_per_s
            end = self.finished_at or time.time()
            return Snapshot(
                job_id=self.job_id, name=self.name, model=self.model, devices=list(self.devices),
                status=self.status, job_status=self.job_status, run_status=self.run_status, message=self.message,
                step=self.step, total_steps=self.total_steps, steps_per_s=steps_per_s, tokens_per_s=tokens_per_s,
                eta_s=eta, elapsed_s=(end - self.started_at) if self.started_at else None,
                last_loss=self.loss.last[1] if self.loss.last else None,
                first_loss=self.loss.first[1] if self.loss.first else None,
                last_eval=self.eval_loss.last[1] if self.eval_loss.last else None,
                loss=self.loss.points(), eval_loss=self.eval_loss.points(), metric_kind=self.metric_kind,
                metrics={name: series.points() for name, series in self.metrics.items()},
                metrics_note=self.metrics_note, metrics_device=self.metrics_device, log_tail=list(self.log_tail), logs_dropped=self.logs_dropped,
                samples_step=self.samples_step, samples=list(self.samples), checkpoints=list(self.checkpoints),
                job=dict(self.job),
            )

    def retained_sizes(self) -> dict[str, int]:
        """How much this state holds (bounded whatever the run length)."""
        with self._lock:
            sizes = {"loss_points": len(self.loss), "eval_points": len(self.eval_loss), "log_lines": len(self.log_tail),
                     "samples": len(self.samples), "rate_window": len(self._rate), "checkpoints": len(self.checkpoints)}
            sizes["metric_points"] = sum(len(series) for series in self.metrics.values())
            return sizes

    def progress_line(self) -> str:
        """One compact line: where the run is now."""
        snap = self.snapshot()
        total = f"/{snap.total_steps}" if snap.total_steps else ""
        parts = [f"{snap.job_id} step {snap.step}{total}"]
        if snap.last_loss is not None:
            parts.append(f"loss per token {snap.last_loss:.4f}")
        if snap.last_eval is not None:
            parts.append(f"eval loss per token {snap.last_eval:.4f}")
        if snap.tokens_per_s:
            parts.append(f"{format_count(snap.tokens_per_s)} tok/s")
        if snap.eta_s is not None:
            parts.append(f"ETA {format_duration(snap.eta_s)}")
        return "  ".join(parts)

    def summary(self) -> str:
        """The final line: status, steps, loss first -> last, eval, speed."""
        snap = self.snapshot()
        total = f"/{snap.total_steps}" if snap.total_steps else ""
        text = f"{snap.job_id} ({snap.model or '?'}) {snap.status}: {snap.step}{total} steps"
        if snap.elapsed_s is not None:
            text += f" in {format_duration(snap.elapsed_s)}"
        if snap.first_loss is not None and snap.last_loss is not None:
            text += f", loss per token {snap.first_loss:.4f} -> {snap.last_loss:.4f}"
        if snap.last_eval is not None:
            text += f", eval loss per token {snap.last_eval:.4f}"
        if snap.tokens_per_s:
            text += f", {format_count(snap.tokens_per_s)} tok/s"
        if snap.message and snap.status != RUN_DONE:
            text += f" ({snap.message})"
        return text


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_count(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"
