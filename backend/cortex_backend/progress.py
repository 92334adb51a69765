"""Each job's progress record: the one place that computes the training numbers every view shows.

A record is folded from step results, the same way for both sources: the managed loop in the training
worker reports each step's summed loss, loss weights and tokens; a client's own loop's
`forward_backward` and `step` results carry the same numbers. Views (the widget, `%cortex jobs`, the
sidebar) read `GET /v1/jobs/{id}` -> `progress` and never recompute.

Records live in memory while a job runs, are written to the store at most once a second (and at
every phase change), and are read back from the store once the job has ended.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cortex_nb.protocol import states
from cortex_nb.protocol.series import CHART_POINTS, DecimatedSeries

from .store import Store

# Steps the rates (steps/s, tokens/s) and the ETA are measured over.
RATE_WINDOW = 20
# How often a running job's record is written to the store (phase changes are written at once).
PERSIST_EVERY_S = 1.0
SAMPLE_CHARS = 300
MAX_SAMPLES = 8


def _step(x: float) -> float | int:
    """A chart point's step: whole while the curve is not decimated, a mean of steps after."""
    return int(x) if float(x).is_integer() else x


def progress_key(job_id: str) -> str:
    """The waiter key a long-poll on a job's progress waits on."""
    return f"progress:{job_id}"


class ProgressRecord:
    """Where one job's training is. Not thread-safe: it is written and read on the IO loop only."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.phase = states.PHASE_WAITING
        self.step = 0
        self.total_steps: int | None = None
        self.loss_per_token: float | None = None
        self.summed_loss: float | None = None
        self.eval_loss_per_token: float | None = None
        self.eval_step: int | None = None
        self.tokens = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.last_checkpoint: str | None = None
        self.last_checkpoint_step: int | None = None
        self.weight_version: int | None = None
        self.history = DecimatedSeries(CHART_POINTS)
        self.eval_history = DecimatedSeries(CHART_POINTS)
        # RL losses: the last step's |sampler logprob - trainer logprob| over its sampled tokens, and its curve.
        self.sampler_mismatch_mean: float | None = None
        self.sampler_mismatch_max: float | None = None
        self.mismatch_history = DecimatedSeries(CHART_POINTS)
        # A training run's device-seconds budget, the job's device-seconds at its last step, and where the
        # budget stopped it (training_loops.py).
        self.budget_device_s: float | None = None
        self.device_seconds_at_step: float | None = None
        self.budget_stop: dict[str, Any] | None = None
        self.samples: dict[str, Any] | None = None
        # Set when the run came back after a backend restart (resume.py): checkpoint, step, lost steps.
        self.resumed: dict[str, Any] | None = None
        # A training run's attempts under its retry policy (managed_retries.py), and its preemptions
        # (preemption.py): both outlive the requeue that follows them.
        self.attempts: list[dict[str, Any]] = []
        self.preemptions: list[dict[str, Any]] = []
        self.updated_at = time.time()
        self._rate: deque[tuple[float, int, int]] = deque(maxlen=RATE_WINDOW + 1)
        # forward_backward results since the last step: a step closes them into one point.
        self._loss = 0.0
        self._weights = 0.0
        self._weights_known = True
        self._tokens = 0

    # folding ---------------------------------------------------------------------------------------
    def record_forward_backward(
        self, summed_loss: float, weights: float | None, tokens: int, at: float | None = None
    ) -> None:
        """One batch's loss as the engine sums it, its loss-weight sum (None when its loss has none) and
        its tokens (attention-mask sum)."""
        if self.started_at is None:
            self.started_at = at or time.time()
        self._loss += float(summed_loss)
        if weights is None:
            self._weights_known = False
        else:
            self._weights += float(weights)
        self._tokens += int(tokens)

    def record_step(self, step: int, at: float | None = None) -> None:
        """An optimizer step closed the batches since the last one into one point of the curve."""
        at = at or time.time()
        if self.started_at is None:
            self.started_at = at
        self.step = int(step)
        self.weight_version = int(step)
        self.summed_loss = self._loss
        self.loss_per_token = (
            self._loss / self._weights if self._weights_known and self._weights > 0 else None
        )
        self.tokens += self._tokens
        if self.loss_per_token is not None:
            self.history.append(self.step, self.loss_per_token)
        self._rate.append((at, self.step, self.tokens))
        self._loss = self._weights = 0.0
        self._weights_known = True
        self._tokens = 0
        if self.source == states.PROGRESS_PRIMITIVE and self.phase == states.PHASE_WAITING:
            self.phase = states.PHASE_TRAINING

    def record_mismatch(self, step: int, mean: float, largest: float) -> None:
        """A step's sampler-vs-trainer logprob gap (as the trainer reports it with the step)."""
        self.sampler_mismatch_mean, self.sampler_mismatch_max = float(mean), float(largest)
        self.mismatch_history.append(int(step), float(mean))

    def record_eval(self, step: int, summed_loss: float, weights: float) -> None:
        if weights > 0:
            self.eval_step = int(step)
            self.eval_loss_per_token = float(summed_loss) / float(weights)
            self.eval_history.append(self.eval_step, self.eval_loss_per_token)

    def record_samples(self, step: int, items: list[dict[str, str]]) -> None:
        self.samples = {
            "step": int(step),
            "items": [
                {"prompt": str(item["prompt"])[:SAMPLE_CHARS], "text": str(item["text"])[:SAMPLE_CHARS]}
                for item in items[:MAX_SAMPLES]
            ],
        }

    def record_checkpoint(self, checkpoint_id: str, step: int) -> None:
        self.last_checkpoint = checkpoint_id
        self.last_checkpoint_step = int(step)

    def set_phase(self, phase: str, at: float | None = None) -> None:
        self.phase = phase
        if phase == states.PHASE_TRAINING and self.started_at is None:
            self.started_at = at or time.time()
        if phase in (
            states.PHASE_KEEP_ALIVE,
            states.PHASE_FINISHED,
            states.PHASE_STOPPED,
            states.PHASE_FAILED,
        ):
            self.finished_at = self.finished_at or at or time.time()

    @property
    def unsaved_steps(self) -> bool:
        """Trained steps that no checkpoint holds yet."""
        return self.step > (self.last_checkpoint_step or 0)

    # reading -----------------------------------------------------------------------------------------
    def rates(self) -> tuple[float | None, float | None]:
        """(steps/s, tokens/s) over the last few steps."""
        if len(self._rate) < 2:
            return None, None
        (t0, s0, k0), (t1, s1, k1) = self._rate[0], self._rate[-1]
        if t1 <= t0:
            return None, None
        return (s1 - s0) / (t1 - t0), (k1 - k0) / (t1 - t0)

    def eta_s(self) -> float | None:
        """Seconds left of a training run's training, at the recent pace; None when unknown."""
        steps_per_s, _ = self.rates()
        if self.phase == states.PHASE_TRAINING and self.total_steps and steps_per_s:
            return max(self.total_steps - self.step, 0) / steps_per_s
        return None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = now or time.time()
        steps_per_s, tokens_per_s = self.rates()
        eta = self.eta_s()
        end = self.finished_at or now
        return {
            "source": self.source,
            "phase": self.phase,
            "step": self.step,
            "total_steps": self.total_steps,
            "loss_per_token": self.loss_per_token,
            "summed_loss": self.summed_loss,
            "eval_loss_per_token": self.eval_loss_per_token,
            "eval_step": self.eval_step,
            "tokens": self.tokens,
            "tokens_per_s": tokens_per_s,
            "steps_per_s": steps_per_s,
            "started_at": self.started_at,
            "elapsed_s": (end - self.started_at) if self.started_at else None,
            "eta_s": eta,
            "last_checkpoint": self.last_checkpoint,
            "last_checkpoint_step": self.last_checkpoint_step,
            "weight_version": self.weight_version,
            "history": [{"step": _step(x), "loss_per_token": y} for x, y in self.history.points()],
            "eval_history": [
                {"step": _step(x), "eval_loss_per_token": y} for x, y in self.eval_history.points()
            ],
            "sampler_mismatch_mean": self.sampler_mismatch_mean,
            "sampler_mismatch_max": self.sampler_mismatch_max,
            "budget_device_s": self.budget_device_s,
            "budget_stop": self.budget_stop,
            "mismatch_history": [
                {"step": _step(x), "sampler_mismatch_mean": y} for x, y in self.mismatch_history.points()
            ],
            "samples": self.samples,
            "resumed": self.resumed,
            "attempts": list(self.attempts),
            "preemptions": list(self.preemptions),
            "updated_at": self.updated_at,
        }

    @classmethod
    def continued(cls, stored: dict[str, Any], step: int, resumed: dict[str, Any]) -> ProgressRecord:
        """A run's record read back after a restart, cut at `step` (where its checkpoint is): the curve
        and counters go on from there, and what was trained after it is dropped (it is trained again)."""
        record = cls(stored.get("source") or states.PROGRESS_MANAGED)
        record.phase = states.PHASE_WAITING
        record.step = record.weight_version = int(step)
        record.total_steps = stored.get("total_steps")
        record.started_at = stored.get("started_at")
        for point in stored.get("history") or []:
            if point["step"] <= step and point["loss_per_token"] is not None:
                record.history.append(point["step"], point["loss_per_token"])
                record.loss_per_token = point["loss_per_token"]
        for point in stored.get("eval_history") or []:
            if point["step"] <= step and point["eval_loss_per_token"] is not None:
                record.eval_history.append(point["step"], point["eval_loss_per_token"])
                record.eval_step, record.eval_loss_per_token = point["step"], point["eval_loss_per_token"]
        was_at = int(stored.get("step") or 0)
        tokens = int(stored.get("tokens") or 0)
        # Tokens of the dropped steps are not known one by one: scale by the steps kept.
        record.tokens = tokens if was_at <= step else int(tokens * step / max(was_at, 1))
        samples = stored.get("samples")
        record.samples = samples if samples and samples.get("step", 0) <= step else None
        if stored.get("last_checkpoint_step") is not None and stored["last_checkpoint_step"] <= step:
            record.last_checkpoint = stored.get("last_checkpoint")
            record.last_checkpoint_step = stored["last_checkpoint_step"]
        record.resumed = resumed
        record.attempts = list(stored.get("attempts") or [])
        record.preemptions = list(stored.get("preemptions") or [])
        return record


class ProgressBook:
    """The progress records of all jobs: in memory while they run, in the store after."""

    def __init__(self, store: Store, notify: Callable[[str], None]) -> None:
        self.store = store
        self.notify = notify
        self._records: dict[str, ProgressRecord] = {}
        self._persisted_at: dict[str, float] = {}

    def get(self, job_id: str) -> ProgressRecord | None:
        return self._records.get(job_id)

    def put(self, job_id: str, record: ProgressRecord) -> None:
        """Hold `record` as the job's (a run resumed after a restart) and write it out."""
        self._records[job_id] = record
        self.changed(job_id, persist=True)

    def start(self, job_id: str, source: str) -> ProgressRecord:
        record = self._records.get(job_id)
        if record is None:
            record = self._records[job_id] = ProgressRecord(source)
        return record

    def changed(self, job_id: str, persist: bool = False) -> None:
        """A record changed: stamp it, wake long-polls on it, and write it out if due (or `persist`)."""
        record = self._records.get(job_id)
        if record is None:
            return
        now = time.time()
        record.updated_at = max(now, record.updated_at + 1e-6)
        if persist or now - self._persisted_at.get(job_id, 0.0) >= PERSIST_EVERY_S:
            self.store.save_progress(job_id, record.to_json(now))
            self._persisted_at[job_id] = now
        self.notify(progress_key(job_id))

    def public(self, job_id: str) -> dict[str, Any] | None:
        record = self._records.get(job_id)
        if record is not None:
            return record.to_json()
        return self.store.get_progress(job_id)

    def job_ended(self, job_id: str, status: str) -> None:
        """Close a job's record with how the job ended, write it, and drop it from memory."""
        record = self._records.pop(job_id, None)
        self._persisted_at.pop(job_id, None)
        if record is None:
            self._close_stored(job_id, status)
            return
        if record.phase in (states.PHASE_WAITING, states.PHASE_TRAINING, states.PHASE_KEEP_ALIVE):
            ended = {states.JOB_DONE: states.PHASE_FINISHED, states.JOB_CANCELLED: states.PHASE_STOPPED}
            record.set_phase(ended.get(status, states.PHASE_FAILED))
        record.updated_at = time.time()
        self.store.save_progress(job_id, record.to_json())
        self.notify(progress_key(job_id))

    def _close_stored(self, job_id: str, status: str) -> None:
        """A job that ended while no record was in memory (after a backend restart): its stored record
        says how it ended too."""
        stored = self.store.get_progress(job_id)
        if stored is None or stored.get("phase") not in (
            states.PHASE_WAITING,
            states.PHASE_TRAINING,
            states.PHASE_KEEP_ALIVE,
        ):
            return
        ended = {states.JOB_DONE: states.PHASE_FINISHED, states.JOB_CANCELLED: states.PHASE_STOPPED}
        stored.update(phase=ended.get(status, states.PHASE_FAILED), eta_s=None, updated_at=time.time())
        self.store.save_progress(job_id, stored)


def fold_request(book: ProgressBook, request: dict[str, Any], result: dict[str, Any]) -> None:
    """Fold a succeeded request of a job's trainer into its record: a client's own loop, or the
    requests around a managed one (a sample in keep-alive, a save from the widget)."""
    if not request["sub_job_id"].startswith(states.TRAINING) or request["op"] not in (
        "forward_backward",
        "step",
        "save",
    ):
        return
    job_id = request["job_id"]
    if request["op"] == "save" and book.get(job_id) is None:
        return  # a job that never trained has no record
    record = book.start(job_id, states.PROGRESS_PRIMITIVE)
    if request["op"] == "forward_backward":
        metrics = result.get("metrics") or {}
        tokens = request["params"].get("tokens", metrics.get("tokens:sum", 0))
        record.record_forward_backward(result.get("loss", 0.0), metrics.get("weights:sum"), tokens)
        return  # a point appears at the step that closes it
    if request["op"] == "step" and "step" in result:
        record.record_step(int(result["step"]))
        if result.get("sampler_mismatch_mean") is not None:
            record.record_mismatch(
                int(result["step"]), result["sampler_mismatch_mean"], result["sampler_mismatch_max"]
            )
    elif request["op"] == "save" and result.get("checkpoint_id"):
        record.record_checkpoint(result["checkpoint_id"], int(result.get("step") or 0))
    book.changed(job_id)
