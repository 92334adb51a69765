"""The live widget of a source run (`%%cortex run`): status, log tail, Cancel, and the run's outputs
once it ends, downloaded next to the notebook (verified) and shown inside the widget.

A feed thread follows the run's logs (long-poll) into a bounded `JobState` and, at the end, appends
the outputs to an `Output` widget (a trait update: safe from a thread, lands in this widget).
"""

from __future__ import annotations

from collections import OrderedDict
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
from IPython.display import display

from ..errors import CortexError
from ..job_state import JobState, format_duration
from ..kernel_threads import BackgroundLoop, capture_parent, start_thread
from ..protocol.states import JOB_DONE, JOB_PENDING, JOB_RUNNING, JOB_TERMINAL, WORD_QUEUED
from .job_view import BADGE_COLORS, BAR_STYLES, NEUTRAL, logs_html, logs_pre, logs_title
from .job_widget import disclosure
from .throttle import RenderThrottle

if TYPE_CHECKING:
    from ..runs import RunHandle

# The run widgets this kernel showed, newest last (bounded).
MAX_REMEMBERED = 32
SHOWN: OrderedDict[str, RunWidget] = OrderedDict()


def run_word(status: str | None) -> str:
    """A source run's word: its status, with `queued` for pending as jobs say it (a run has no
    training phases, so the job words for those do not apply)."""
    return {JOB_PENDING: WORD_QUEUED, JOB_RUNNING: "running"}.get(
        status or JOB_PENDING, status or WORD_QUEUED
    )


def log_line(entry: dict[str, Any]) -> str:
    """stdout as is; stderr and the backend's own lines marked, as a terminal would show them apart."""
    stream = entry.get("stream", "stdout")
    return entry["line"] if stream == "stdout" else f"[{stream}] {entry['line']}"


def run_summary(info: dict[str, Any]) -> str:
    """One line: run, name, status (with failure code), exit code, wall time."""
    text = f"{info['run_id']} ({info.get('name') or 'run'}) {info['status']}"
    if info.get("failure_code"):
        text += f" [{info['failure_code']}]"
    if info.get("exit_code") is not None:
        text += f", exit code {info['exit_code']}"
    if info.get("started_at") and info.get("finished_at"):
        text += f", {format_duration(info['finished_at'] - info['started_at'])}"
    if info.get("failure_message") and info["status"] != JOB_DONE:
        text += f": {info['failure_message']}"
    return text


class RunFeed(BackgroundLoop):
    """Follows one run: log lines and status; at the end calls `on_end(info)` once."""

    LOG_WAIT_S = 2.0
    MAX_FAILURES = 12

    def __init__(self, handle: RunHandle, state: JobState, on_end: Any = None) -> None:
        super().__init__()
        self.handle = handle
        self.state = state
        self.on_end = on_end
        self.cursor = 0

    def thread_name(self) -> str:
        return f"cortex-run-feed-{self.handle.run_id}"

    def _loop(self) -> None:
        failures, backoff = 0, 1.0
        while not self._closed.is_set():
            try:
                page = self.handle.log_page(self.cursor, wait_s=self.LOG_WAIT_S)
            except CortexError as exc:
                failures += 1
                if failures >= self.MAX_FAILURES:
                    self.state.note(f"stopped following: {exc.message}")
                    return
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            except Exception as exc:  # e.g. a closed client: stop visibly, never crash the thread
                self.state.note(f"stopped following: {type(exc).__name__}: {exc}")
                return
            failures, backoff = 0, 1.0
            self.cursor = page["cursor"]
            if page["lines"] or page.get("dropped"):
                self.state.add_log_lines([log_line(entry) for entry in page["lines"]], page.get("dropped", 0))
            status = page.get("run_status")
            if status != self.state.job_status:
                self._take(self.handle.refresh())
            if status in JOB_TERMINAL and not page["lines"]:
                if self.on_end is not None:
                    self.on_end(self.handle.info)
                return

    def _take(self, info: dict[str, Any]) -> None:
        self.state.set_job(
            {
                "status": info["status"],
                "name": info.get("name"),
                "failure_code": info.get("failure_code"),
                "failure_message": info.get("failure_message"),
            }
        )
        self.state.devices = list(info.get("devices") or [])


class RunWidget(widgets.VBox):
    """A live view of one source run."""

    def __init__(self, handle: RunHandle, outputs_dir: Path) -> None:
        self.handle = handle
        self.outputs_dir = outputs_dir
        self.state = JobState(handle.run_id, handle.info.get("name"))
        self.state.set_job({"status": handle.info["status"], "name": handle.info.get("name")})
        self.header = widgets.HTML()
        self.message = widgets.HTML()
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="320px"))
        self.logs_body = widgets.HTML()
        self.logs = disclosure("log tail", self.logs_body, open_=True)
        self.outputs = widgets.Output()
        self.cancel_button = widgets.Button(
            description="Cancel", icon="stop", button_style="danger", tooltip="Cancel this run on the backend"
        )
        self.cancel_button.on_click(self._on_cancel)
        self.saved: dict[str, Path] = {}
        self.action_errors: list[str] = []
        super().__init__(
            children=[
                self.header,
                self.message,
                self.progress,
                self.logs,
                self.outputs,
                widgets.HBox([self.cancel_button]),
            ]
        )
        self.add_class("cortex-run-widget")
        self.feed = RunFeed(handle, self.state, self._collect_outputs)
        self.throttle = RenderThrottle(self.render, lambda: not self.feed.alive and self.state.finished)
        self.state.subscribe(self.throttle.mark_dirty)
        self.render()

    def show(self) -> RunWidget:
        parent = capture_parent()
        self.throttle.parent = parent
        self._display = display(self, display_id=True) if parent else None
        self._picture_word = self._moment()
        self.feed.start(parent)
        SHOWN[self.handle.run_id] = self
        while len(SHOWN) > MAX_REMEMBERED:
            SHOWN.popitem(last=False)
        return self

    def close(self) -> None:
        self.feed.stop()
        self.throttle.close()
        super().close()

    def _on_cancel(self, _button: Any = None) -> None:
        self.cancel_button.disabled = True
        start_thread(self._cancel, f"cortex-cancel-{self.handle.run_id}", self.throttle.parent)

    def _cancel(self) -> None:
        try:
            self.handle.cancel()
            self.state.note("cancel requested")
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"cancel failed: {exc.message}")
            self.cancel_button.disabled = False

    def _collect_outputs(self, info: dict[str, Any]) -> None:
        """At the end: download the collected outputs (verified) and show them in the widget."""
        from ..run_outputs import render_output

        self.state.note(run_summary(info))
        if info["status"] != JOB_DONE:
            return
        try:
            self.saved = self.handle.outputs(dest=self.outputs_dir, keep_paths=True)
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"{run_summary(info)}; outputs not saved: {exc.message}")
            return
        for name, path in sorted(self.saved.items()):
            self.outputs.append_display_data(render_output(name, path))
        self.throttle.mark_dirty()

    def render(self) -> None:
        snap = self.state.snapshot()
        word = run_word(snap.job_status)
        color = BADGE_COLORS.get(word, NEUTRAL)
        devices = f" · device <code>{escape(', '.join(snap.devices))}</code>" if snap.devices else ""
        self.header.value = (
            f"<b>{escape(snap.job_id)}</b> · {escape(snap.name or 'run')}{devices} "
            f'<span class="cortex-status" style="background:{color};color:white;border-radius:8px;padding:1px 8px">'
            f"{escape(word)}</span>"
        )
        self.message.value = f'<span style="opacity:.8">{escape(snap.message)}</span>' if snap.message else ""
        finished = snap.job_status in JOB_TERMINAL
        self.progress.value = 1 if finished else 0
        self.progress.bar_style = BAR_STYLES.get(word, "info")
        self.logs_body.value = logs_pre(snap)
        self.logs.titles = (logs_title(snap),)
        self.cancel_button.disabled = finished
        if self.saved:
            self.message.value += "<br>" + escape(
                "saved: " + ", ".join(f"{n} -> {p}" for n, p in sorted(self.saved.items()))
            )
        display_handle = getattr(self, "_display", None)
        moment = self._moment()
        if display_handle is not None and moment != getattr(self, "_picture_word", None):
            # The output's picture follows the run's word (and its outputs, once saved): what a notebook
            # shows where the widget's kernel or model is gone.
            self._picture_word = moment
            display_handle.update(self)

    def _moment(self) -> tuple[Any, ...]:
        snap = self.state.snapshot()
        return (run_word(snap.job_status), bool(self.saved), snap.message)

    def static_html(self) -> str:
        """The run as one self-contained HTML block: its word, its summary and the log tail."""
        return (
            f'<div class="cortex-run-static" data-cortex-run="{escape(self.handle.run_id, quote=True)}">'
            f"<div>{self.header.value}</div><div>{self.message.value}</div>"
            f"{logs_html(self.state.snapshot(), open_=True)}</div>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, and next to it the static picture (see `static_html`)."""
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/html"] = self.static_html()
        return bundle

    def __repr__(self) -> str:
        snap = self.state.snapshot()
        return f"<cortex run {snap.job_id} {run_word(snap.job_status)} {len(snap.log_tail)} log lines>"
