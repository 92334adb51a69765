"""Following a job on the backend for a live view: its JSON with the progress record (one long-poll
per update), its log tail and its device metrics. Everything lands in a `JobState`; this module never
touches a widget.

Load on the backend stays small and flat, whatever the job's pace: one progress request every two
seconds at most (`PROGRESS_EVERY_S`; a long-poll answers as soon as the record changes), a log page
every 2 s while the view shows its log tail and every 15 s while it is closed, device metrics every 10 s.
About 0.7 requests a second for a training job (bench/bench_outlives_kernel.py); the kernel never
rebuilds progress from request results.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import errors
from .job_state import JobState
from .kernel_threads import BackgroundLoop
from .protocol.states import JOB_TERMINAL
from .reconnect import backend_away

if TYPE_CHECKING:
    from .client import Client


def unreachable(exc: errors.CortexError) -> bool:
    """Whether an error says the backend is gone (not that it refused something)."""
    return isinstance(exc, errors.ConnectionError) or exc.code == "backend_unavailable"


class JobFeed(BackgroundLoop):
    """One background thread per view that keeps a `JobState` current from the backend."""

    # Longest a progress long-poll is held open, and the shortest gap between two of them.
    PROGRESS_WAIT_S = 5.0
    PROGRESS_EVERY_S = 2.0
    LOGS_EVERY_S = 2.0  # while the view shows the log tail (`state.logs_open`)
    LOGS_CLOSED_EVERY_S = 15.0  # while it does not: the line count stays roughly current
    METRICS_EVERY_S = 10.0
    # Consecutive failed rounds (with backoff, about five minutes) before a view stops following. A backend
    # that does not answer is waited for `client.poll.reconnect_s` instead: it may be restarting.
    MAX_FAILURES = 12

    def __init__(self, client: Client, state: JobState) -> None:
        super().__init__()
        self.client = client
        self.state = state
        self.log_cursor = 0
        self.metrics_since: float | None = None
        self.metrics_available = True
        self.rounds = 0
        self._due: dict[str, float] = {}

    def thread_name(self) -> str:
        return f"cortex-feed-{self.state.job_id}"

    def _loop(self) -> None:
        backoff = 1.0
        failures = 0
        away_since: float | None = None
        while not self._closed.is_set():
            started = time.monotonic()
            try:
                self.poll_once(wait_s=self.PROGRESS_WAIT_S)
                backoff = 1.0
                away_since = None
            except errors.NotFoundError as exc:
                self.state.note(exc.message)
                return
            except errors.CortexError as exc:
                failures += 1
                away = unreachable(exc) or backend_away(exc)
                if away:
                    away_since = away_since or time.monotonic()
                    away_s = time.monotonic() - away_since
                    self.state.set_backend_gone(
                        f"backend restarting, reconnecting… ({away_s:.0f}s of {self.client.poll.reconnect_s:.0f}s);"
                        f" {self.client.url} does not answer. If it stays down,"
                        " %cortex connect --local starts a new local backend"
                    )
                gave_up = (
                    time.monotonic() - away_since >= self.client.poll.reconnect_s
                    if away
                    else failures >= self.MAX_FAILURES
                )
                if gave_up:
                    self.state.note(
                        f"stopped following: {exc.message} (%cortex job {self.state.job_id} follows again)"
                    )
                    return
                self.state.add_log_lines([f"[cortex] lost touch with the backend, retrying: {exc.message}"])
                self._closed.wait(backoff)
                # While the backend is away, look often enough to show the resumed step soon after it is back.
                backoff = min(backoff * 2, 5.0 if away else 30.0)
                continue
            except (
                Exception
            ) as exc:  # e.g. the client was closed under us: stop, visibly, never crash a thread
                if not self._closed.is_set():
                    self.state.note(f"stopped following: {type(exc).__name__}: {exc}")
                return
            failures = 0
            if self.state.job_status in JOB_TERMINAL:
                return  # poll_once collected the last lines and samples in the round that saw the end
            self._closed.wait(max(self.PROGRESS_EVERY_S - (time.monotonic() - started), 0.0))

    def poll_once(self, wait_s: float = 0.0) -> None:
        """One round: the job (waiting up to `wait_s` for its progress to change), then logs and metrics
        when due (always once the job has ended)."""
        updated = (self.state.progress or {}).get("updated_at")
        if wait_s > 0 and self.state.job_status not in JOB_TERMINAL:
            job = self.client.wait_for_progress(self.state.job_id, updated, wait_s)
        else:
            job = self.client.get_job(self.state.job_id)
        self.state.set_job(job)
        ended = job["status"] in JOB_TERMINAL
        if (
            self._is_due("logs", self.LOGS_EVERY_S if self.state.logs_open else self.LOGS_CLOSED_EVERY_S)
            or ended
        ):
            self._poll_logs()
        if self.metrics_available and (self._is_due("metrics", self.METRICS_EVERY_S) or ended):
            self._poll_metrics()
        self.rounds += 1

    def read_logs_next_round(self) -> None:
        """A view just opened its log tail: read new lines in the next round, not when the slow
        closed-tail timer says."""
        self._due.pop("logs", None)

    def _poll_logs(self) -> None:
        while True:
            page = self.client.tail_logs(self.state.job_id, self.log_cursor, limit=1000)
            self.log_cursor = page["cursor"]
            if page["lines"] or page.get("dropped"):
                self.state.add_log_lines([line["line"] for line in page["lines"]], page.get("dropped", 0))
            if len(page["lines"]) < 1000:
                return

    def _poll_metrics(self) -> None:
        try:
            page = self.client.get_job_metrics(self.state.job_id, self.metrics_since)
        except errors.NotFoundError as exc:
            if exc.code != "route_not_found":  # an older backend, without GET /v1/jobs/{id}/metrics
                raise
            self.metrics_available = False
            self.state.add_metrics([], note="this backend serves no device metrics")
            return
        self.metrics_since = page.get("next_since", self.metrics_since)
        # The backend's one quiet line ("CPU host: no GPU metrics"); older backends only give the reason.
        note = page.get("gpu_metrics_note", page.get("gpu_unavailable_reason"))
        self.state.add_metrics(page.get("samples") or [], note=note)

    def _is_due(self, name: str, every_s: float) -> bool:
        now = time.monotonic()
        if now >= self._due.get(name, 0.0):
            self._due[name] = now + every_s
            return True
        return False
