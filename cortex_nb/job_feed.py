"""Following a job on the backend for a live view: log lines (long-poll), status, device metrics,
and, for a job no loop in this kernel drives, its steps and loss read back from request results.

Everything lands in a `JobState`; this module never touches a widget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import errors
from .kernel_threads import BackgroundLoop
from .states import JOB_TERMINAL, REQUEST_SUCCEEDED, REQUEST_TERMINAL
from .widgets.state import JobState

if TYPE_CHECKING:
    from .client import Client

class RequestProgress:
    """Steps and per-token loss of a job driven elsewhere, read back from its finished requests.

    forward_backward results carry `loss` (a sum) and `metrics["weights:sum"]`; a `step` result closes
    the accumulated batches into one point.
    """

    MAX_FETCHES = 400

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.job_id = job_id
        self._after = 0.0
        self._seen_at_edge: set[str] = set()
        self._loss_sum = 0.0
        self._weights = 0.0
        self._tokens = 0

    def poll(self, state: JobState, limit: int = 1000) -> int:
        """Fold new finished requests into `state`; returns how many steps were added.

        At most `MAX_FETCHES` results are read per poll (the newest): a fast loop elsewhere leaves gaps
        in the chart rather than a flood of requests from a view.
        """
        fresh = []
        for request in sorted(self.client.list_requests(self.job_id, limit=limit), key=lambda r: r["created_at"]):
            if request["created_at"] < self._after or request["id"] in self._seen_at_edge:
                continue
            if request["status"] not in REQUEST_TERMINAL:
                break  # keep submission order: come back for this one and what follows
            if request["created_at"] > self._after:
                self._after, self._seen_at_edge = request["created_at"], set()
            self._seen_at_edge.add(request["id"])
            if request["status"] == REQUEST_SUCCEEDED and request["op"] in ("forward_backward", "step"):
                fresh.append(request)
        if len(fresh) > self.MAX_FETCHES:
            fresh = fresh[-self.MAX_FETCHES :]
            self._loss_sum = self._weights = 0.0
            self._tokens = 0
        added = 0
        for request in fresh:
            result = self.client.get_request_status(self.job_id, request["id"]).get("result") or {}
            if request["op"] == "forward_backward":
                metrics = result.get("metrics") or {}
                if "weights:sum" in metrics:
                    self._loss_sum += float(result.get("loss", 0.0))
                    self._weights += float(metrics["weights:sum"])
                self._tokens += int(metrics.get("tokens:sum", 0))
            elif "step" in result:
                loss = self._loss_sum / self._weights if self._weights else None
                state.record_step(int(result["step"]), loss, self._tokens, at=request.get("finished_at"))
                self._loss_sum = self._weights = 0.0
                self._tokens = 0
                added += 1
        return added


class JobFeed(BackgroundLoop):
    """One background thread per view that keeps a `JobState` current from the backend."""

    LOG_WAIT_S = 2.0
    STATUS_EVERY_S = 5.0
    METRICS_EVERY_S = 2.0
    REQUESTS_EVERY_S = 3.0
    # After a loop here ends, the job may stay up (for sampling); follow it a little longer, then rest.
    LINGER_S = 10.0
    # Consecutive failed rounds (with backoff, about five minutes) before a view stops following.
    MAX_FAILURES = 12

    def __init__(
        self,
        client: Client,
        state: JobState,
        follow_requests: bool = False,
        run_finished: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.state = state
        self.requests = RequestProgress(client, state.job_id) if follow_requests else None
        self.run_finished = run_finished
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
        finishing_since: float | None = None
        while not self._closed.is_set():
            try:
                self.poll_once(wait_s=0.0 if finishing_since else self.LOG_WAIT_S)
                backoff = 1.0
            except errors.NotFoundError as exc:
                self.state.note(exc.message)
                return
            except errors.CortexError as exc:
                failures += 1
                if failures >= self.MAX_FAILURES:
                    self.state.note(f"stopped following: {exc.message} (%cortex job {self.state.job_id} follows again)")
                    return
                self.state.add_log_lines([f"[cortex] lost touch with the backend, retrying: {exc.message}"])
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            except Exception as exc:  # e.g. the client was closed under us: stop, visibly, never crash a thread
                if not self._closed.is_set():
                    self.state.note(f"stopped following: {type(exc).__name__}: {exc}")
                return
            failures = 0
            if self.state.job_status in JOB_TERMINAL:
                if finishing_since is not None:
                    return  # one more round after the end collected the last lines and samples
                finishing_since = time.monotonic()
            elif self.run_finished is not None and self.run_finished():
                finishing_since = finishing_since or time.monotonic()
                if time.monotonic() - finishing_since > self.LINGER_S:
                    return
                self._closed.wait(1.0)

    def poll_once(self, wait_s: float = 0.0) -> None:
        """One round: new log lines (waiting up to `wait_s`), then whatever else is due."""
        page = self.client.tail_logs(self.state.job_id, self.log_cursor, wait_s=wait_s)
        self.log_cursor = page["cursor"]
        if page["lines"] or page.get("dropped"):
            self.state.add_log_lines([line["line"] for line in page["lines"]], page.get("dropped", 0))
        status = page.get("job_status")
        ended = status in JOB_TERMINAL
        if self._is_due("status", self.STATUS_EVERY_S) or (ended and status != self.state.job_status):
            self.state.set_job(self.client.get_job(self.state.job_id))
        if self.metrics_available and (self._is_due("metrics", self.METRICS_EVERY_S) or ended):
            self._poll_metrics()
        if self.requests is not None and (self._is_due("requests", self.REQUESTS_EVERY_S) or ended):
            self.requests.poll(self.state)
        self.rounds += 1

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
