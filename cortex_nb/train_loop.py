"""The `%%cortex train` loop: pipelined forward_backward + step on a background thread.

The next step's requests are queued before the last step's result is read, so the worker never
waits for the notebook. Eval, sampling and checkpoints ride the same FIFO queue right after the
step they belong to. The loop only writes to a `JobState`; views read it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import errors
from .batching import rows_to_batch
from .kernel_threads import start_thread
from .states import JOB_CANCELLED, JOB_RUNNING, JOB_TERMINAL
from .train_data import PackedData
from .train_spec import TrainSpec
from .widgets.state import (
    RUN_CANCELLED,
    RUN_DONE,
    RUN_FAILED,
    RUN_STARTING,
    RUN_STOPPED,
    RUN_TRAINING,
    JobState,
)

if TYPE_CHECKING:
    from .futures import APIFuture
    from .training import TrainingJob

# Steps queued beyond the one being read: 1 keeps the worker busy without racing far ahead of a Cancel.
PIPELINE_DEPTH = 1
# Finished runs stay reachable (`%cortex job ID` re-shows them) up to this many.
MAX_REMEMBERED_RUNS = 32
_RUNS: OrderedDict[str, TrainingRun] = OrderedDict()


def live_run(job_id: str) -> TrainingRun | None:
    """The run this kernel drives (or drove) for `job_id`, if any."""
    return _RUNS.get(job_id)


def remember_run(run: TrainingRun) -> None:
    _RUNS[run.job.job_id] = run
    _RUNS.move_to_end(run.job.job_id)
    while len(_RUNS) > MAX_REMEMBERED_RUNS:
        _RUNS.popitem(last=False)


def planned_steps(spec: TrainSpec, data: PackedData) -> int:
    if spec.steps is not None:
        return spec.steps
    return max(1, round(data.steps_per_epoch(spec.batch_size) * float(spec.epochs or 1)))


@dataclass
class _InFlight:
    step: int
    forward_backward: APIFuture
    optimizer_step: APIFuture
    weight_sum: float
    tokens: int
    evals: list[tuple[APIFuture, np.ndarray]] = field(default_factory=list)
    samples: APIFuture | None = None
    save: APIFuture | None = None

    def futures(self) -> list[APIFuture]:
        extra = [future for future, _ in self.evals] + [f for f in (self.samples, self.save) if f is not None]
        return [self.forward_backward, self.optimizer_step, *extra]


class TrainingRun:
    """One training loop over a `TrainingJob`, on its own thread. `stop()` ends it early."""

    def __init__(
        self,
        job: TrainingJob,
        spec: TrainSpec,
        data: PackedData,
        eval_data: PackedData | None = None,
        state: JobState | None = None,
        pipeline_depth: int = PIPELINE_DEPTH,
    ) -> None:
        self.job = job
        self.pipeline_depth = pipeline_depth
        self.spec = spec
        self.data = data
        self.total_steps = planned_steps(spec, data)
        self.state = state or JobState(job.job_id, job.info.get("name"), spec.base_model)
        self.state.set_plan(self.total_steps)
        self.error: errors.CortexError | None = None
        self.last_checkpoint: str | None = None
        self._eval_batches = self._eval_batches_for(eval_data)
        self._stop = threading.Event()
        self._stop_status = RUN_STOPPED
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: deque[_InFlight] = deque()
        self._thread: threading.Thread | None = None
        self.on_finished: list[Callable[[TrainingRun], None]] = []

    # control ------------------------------------------------------------------------------------
    def start(self, parent: Any = None) -> TrainingRun:
        remember_run(self)
        self._thread = start_thread(self._run, f"cortex-train-{self.job.job_id}", parent)
        return self

    def stop(self, status: str = RUN_STOPPED) -> None:
        """Stop after the step being read; queued requests are cancelled on the backend."""
        self._stop_status = status
        self._stop.set()
        self._cancel_in_flight()

    def cancel_job(self) -> None:
        """Cancel the whole job on the backend (the Cancel button)."""
        self.stop(RUN_CANCELLED)
        self.job.cancel()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the loop has ended."""
        return self._done.wait(timeout_s)

    @property
    def status(self) -> str:
        return self.state.run_status or RUN_STARTING

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def __repr__(self) -> str:
        return f"<TrainingRun {self.job.job_id} {self.status} step {self.state.step}/{self.total_steps}>"

    # the loop -----------------------------------------------------------------------------------
    def _run(self) -> None:
        state = self.state
        try:
            state.set_run_status(RUN_STARTING)
            self._wait_ready()
            state.set_job(self.job.info)
            state.set_run_status(RUN_TRAINING)
            self._train()
            if self._stop.is_set():
                state.set_run_status(self._stop_status, "stopped before the last step" if self._stop_status == RUN_STOPPED else None)
            else:
                state.set_run_status(RUN_DONE)
        except errors.CortexError as exc:
            self._ended_by(exc)
        except Exception as exc:  # a bug must still end the run visibly, never hang a view
            self.error = errors.CortexError(f"{type(exc).__name__}: {exc}")
            state.set_run_status(RUN_FAILED, str(self.error))
        finally:
            self._done.set()
            for callback in self.on_finished:
                callback(self)

    def _wait_ready(self) -> None:
        while True:
            if self._stop.is_set():
                raise errors.CortexError("stopped while the job was starting", code="cancelled")
            try:
                info = self.job.client.wait_for_job(self.job.job_id, (JOB_RUNNING, *JOB_TERMINAL), timeout_s=5.0)
            except errors.TimeoutError:
                continue
            self.job.info = info
            self.state.set_job(info)
            if info["status"] == JOB_RUNNING:
                return
            raise errors.RequestFailed(
                f"job {self.job.job_id} ended {info['status']} before training started: {info.get('failure_message') or ''}".strip(),
                code=info.get("failure_code") or info["status"],
            )

    def _train(self) -> None:
        batches = self.data.batches(self.spec.batch_size, self.spec.seed)
        for step in range(1, self.total_steps + 1):
            if self._stop.is_set():
                break
            pending = self._submit(step, next(batches), final=step == self.total_steps)
            with self._lock:
                self._in_flight.append(pending)
            # Read the previous step only now that this one is queued behind it.
            while len(self._in_flight) > self.pipeline_depth:
                self._finish(self._in_flight[0])
        while self._in_flight and not self._stop.is_set():
            self._finish(self._in_flight[0])
        self._cancel_in_flight()

    def _submit(self, step: int, rows: list, final: bool) -> _InFlight:
        batch = rows_to_batch(rows, self.data.pad_id)
        pending = _InFlight(
            step=step,
            forward_backward=self.job.forward_backward(batch),
            optimizer_step=self.job.step(),
            weight_sum=float(batch["weights"].sum()),
            tokens=int(batch["attention_mask"].sum()),
        )
        if self._eval_batches and (final or step % self.spec.eval.every == 0):
            pending.evals = [(self.job.forward(eval_batch), eval_batch["weights"]) for eval_batch in self._eval_batches]
        sample = self.spec.sample
        if sample and (final or step % sample.every == 0):
            pending.samples = self.job.generate(sample.prompts, max_tokens=sample.max_tokens, temperature=sample.temperature)
        save = self.spec.save
        if save and (final or step % save.every == 0):
            pending.save = self._submit_save(save.type)
        return pending

    def _submit_save(self, kind: str) -> APIFuture:
        # Queued right after this step's `step`, so the backend names it step-<step>.
        return self.job.save(checkpoint_type=kind)

    def _finish(self, pending: _InFlight) -> None:
        """Read one step's results into the state (blocks until the backend has them)."""
        result = pending.forward_backward.result()
        pending.optimizer_step.result()
        loss = result["loss"] / pending.weight_sum if pending.weight_sum else None
        self.state.record_step(pending.step, loss, pending.tokens)
        if pending.evals:
            total = weights = 0.0
            for future, eval_weights in pending.evals:
                logprobs = future.result()["tensors"]["logprobs"]
                total -= float((logprobs * eval_weights).sum())
                weights += float(eval_weights.sum())
            if weights:
                self.state.record_eval(pending.step, total / weights)
        if pending.samples is not None:
            generated = pending.samples.result()
            prompts = generated.prompts
            self.state.record_samples(pending.step, [(prompts[s["prompt_index"]], s["text"] or "") for s in generated.samples])
        if pending.save is not None:
            saved = pending.save.result()
            checkpoint_id = saved.get("checkpoint_id") if isinstance(saved, dict) else getattr(saved, "checkpoint_id", None)
            self.last_checkpoint = checkpoint_id or f"step-{pending.step}"
            self.state.record_checkpoint(self.last_checkpoint)
        with self._lock:
            if self._in_flight and self._in_flight[0] is pending:
                self._in_flight.popleft()

    def _cancel_in_flight(self) -> None:
        with self._lock:
            futures = [future for pending in self._in_flight for future in pending.futures()]
            self._in_flight.clear()
        for future in futures:
            try:
                future.cancel()
            except errors.CortexError:
                pass  # already finished, or the job ended: nothing left to cancel

    def _ended_by(self, exc: errors.CortexError) -> None:
        """Work out why a request failed: our stop, the job cancelled elsewhere, or a real failure."""
        self._cancel_in_flight()
        try:
            job_status = self.job.refresh()["status"]
            self.state.set_job(self.job.info)
        except errors.CortexError:
            job_status = None
        if job_status == JOB_CANCELLED or self._stop_status == RUN_CANCELLED:
            self.state.set_run_status(RUN_CANCELLED, "cancelled")
        elif self._stop.is_set():
            self.state.set_run_status(self._stop_status, "stopped before the last step")
        else:
            self.error = exc
            self.state.set_run_status(RUN_FAILED, exc.message)

    def _eval_batches_for(self, eval_data: PackedData | None) -> list[dict[str, np.ndarray]]:
        if eval_data is None or self.spec.eval is None:
            return []
        rows = eval_data.rows[: self.spec.eval.max_rows]
        size = self.spec.batch_size
        return [rows_to_batch(rows[i : i + size], eval_data.pad_id) for i in range(0, len(rows), size)]


def wait_for_run(run: TrainingRun, on_tick: Callable[[], None] | None = None, tick_s: float = 0.5) -> bool:
    """Block until the run ends (the `--wait` and non-interactive paths); False if Ctrl-C stopped it.

    Ctrl-C stops the loop and cancels its queued requests on the backend; the job itself stays up.
    """
    try:
        while not run.wait(tick_s):
            if on_tick is not None:
                on_tick()
    except KeyboardInterrupt:
        run.stop(RUN_STOPPED)
        run.wait(30)
        return False
    finally:
        if on_tick is not None:
            on_tick()
    return True
