"""Text progress for blocking runs (CORTEX_NONINTERACTIVE=1, CI, nbval, papermill): a handful of
compact lines printed from the main thread, then one summary line."""

from __future__ import annotations

from .job_state import JobState
from .protocol.states import WORD_QUEUED, WORD_STARTING


class ProgressPrinter:
    """Prints a progress line each time the run crosses another `1/lines` of its steps, or reports
    a new eval loss."""

    def __init__(self, state: JobState, lines: int = 10, out=None) -> None:
        self.state = state
        self.lines = max(1, lines)
        self.out = out
        self._printed_step = 0
        self._printed_evals = 0
        self._status: tuple[str, str | None] | None = None

    def tick(self) -> None:
        state = self.state
        snap = state.snapshot()
        status = (snap.status, snap.detail if snap.status == WORD_QUEUED else None)
        if status != self._status:
            self._status = status
            if snap.status in (WORD_STARTING, WORD_QUEUED):
                self._print(f"{state.job_id}: {snap.status}" + (f" ({snap.detail})" if status[1] else ""))
        total = state.total_steps or 0
        every = max(1, total // self.lines) if total else 10
        evals = state.eval_loss.count
        crossed = state.step // every > self._printed_step // every or (total and state.step == total)
        if state.step > self._printed_step and (crossed or evals > self._printed_evals):
            self._printed_step = state.step
            self._printed_evals = evals
            self._print(state.progress_line())

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)
