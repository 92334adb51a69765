"""The live job widget: header, progress, loss and device charts, samples, log tail, buttons.

A background feed (`JobFeed`: the job's progress record from the backend, logs, metrics) only writes
the `JobState`; a `RenderThrottle` turns state into trait values at most 4 times a second. Widgets are
created on the main thread, at display, where the cell's parent message is captured for the threads.
"""

from __future__ import annotations

from collections import OrderedDict
from html import escape
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
from IPython.display import display

from ..errors import CortexError
from ..job_feed import JobFeed
from ..kernel_threads import capture_parent, start_thread
from ..states import (
    JOB_TERMINAL,
    WORD_CANCELLED,
    WORD_DONE,
    WORD_FAILED,
    WORD_IDLE,
    WORD_QUEUED,
    WORD_SAMPLING,
    WORD_STARTING,
    WORD_TRAINING,
)
from .state import TERMINAL_WORDS, JobState, Snapshot, format_count, format_duration
from .svg import Line, line_chart
from .throttle import RenderThrottle

if TYPE_CHECKING:
    from ..client import Client

LOG_LINES_SHOWN = 40
MAX_REMEMBERED_WIDGETS = 32
OPEN_IN_SIDEBAR_CLASS = "cortex-open-in-sidebar"
BADGE_COLORS = {
    WORD_QUEUED: "#6b7280", WORD_STARTING: "#2563eb", WORD_TRAINING: "#2563eb", WORD_SAMPLING: "#0891b2",
    WORD_IDLE: "#6b7280", WORD_DONE: "#15803d", WORD_FAILED: "#b91c1c", WORD_CANCELLED: "#b45309",
}
BAR_STYLES = {WORD_DONE: "success", WORD_FAILED: "danger", WORD_CANCELLED: "warning"}
COLORS = {"train": "#2563eb", "eval": "#ea580c", "util": "#16a34a", "memory": "#9333ea"}


_WIDGETS: OrderedDict[str, JobWidget] = OrderedDict()


class JobWidget(widgets.VBox):
    """A live view of one job. Display it; it follows the backend's record of the job."""

    def __init__(
        self,
        client: Client,
        state: JobState,
        save_supported: bool = False,
    ) -> None:
        self.client = client
        self.state = state
        self.header = widgets.HTML()
        self.message = widgets.HTML()
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="320px"))
        self.stats = widgets.HTML()
        self.loss_chart = widgets.HTML()
        self.device_chart = widgets.HTML()
        self.samples = widgets.HTML()
        self.logs = widgets.HTML()
        self.cancel_button = widgets.Button(description="Cancel", icon="stop", button_style="danger",
                                            tooltip="Cancel this job on the backend")
        self.cancel_button.on_click(self._on_cancel)
        self.save_button = widgets.Button(description="Save checkpoint", icon="save",
                                          tooltip="Save a resumable checkpoint now")
        self.save_button.on_click(self._on_save)
        self.open_in_sidebar = widgets.HTML(open_in_sidebar_html(state.job_id))
        buttons = [self.cancel_button] + ([self.save_button] if save_supported else []) + [self.open_in_sidebar]
        super().__init__(children=[
            self.header,
            self.message,
            widgets.HBox([self.progress, self.stats]),
            widgets.HBox([self.loss_chart, self.device_chart]),
            self.samples,
            self.logs,
            widgets.HBox(buttons),
        ])
        self.add_class("cortex-job-widget")
        self.save_supported = save_supported
        self.feed = JobFeed(client, state)
        self.throttle = RenderThrottle(self.render, self._finished)
        self.action_errors: list[str] = []
        self._display_handle: Any = None
        state.subscribe(self.throttle.mark_dirty)
        self.render()

    # life cycle ---------------------------------------------------------------------------------
    def show(self) -> JobWidget:
        """Display under the current cell and start following; the parent is captured here."""
        parent = capture_parent()
        self.throttle.parent = parent
        handle = display(self, display_id=True)
        # In a kernel, the final state also replaces the text/plain saved with the output.
        self._display_handle = handle if parent else None
        self.feed.start(parent)
        self.throttle.mark_dirty()
        return self

    def follow(self) -> JobWidget:
        """Start following without displaying (for views that are shown elsewhere)."""
        self.feed.start(capture_parent())
        return self

    def close(self) -> None:
        self.feed.stop()
        self.throttle.close()
        super().close()

    def _finished(self) -> bool:
        return not self.feed.alive and self.state.finished

    # buttons ------------------------------------------------------------------------------------
    def _on_cancel(self, _button: Any = None) -> None:
        """Cancel on the backend from a helper thread, so a slow backend never blocks the kernel."""
        self.cancel_button.disabled = True
        self.state.note("cancelling…")
        start_thread(self._cancel, f"cortex-cancel-{self.state.job_id}", self.throttle.parent)

    def _cancel(self) -> None:
        try:
            self.state.set_job(self.client.cancel_job(self.state.job_id))
            self.state.note("cancelled")
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"cancel failed: {exc.message}")
            self.cancel_button.disabled = False
        if not self.feed.alive:
            self.feed.start(self.throttle.parent)

    def _on_save(self, _button: Any = None) -> None:
        self.save_button.disabled = True
        start_thread(self._save, f"cortex-save-{self.state.job_id}", self.throttle.parent)

    def _save(self) -> None:
        from ..training import TrainingJob

        try:
            job = TrainingJob(self.client, self.client.get_job(self.state.job_id))
            saved = job.save().result()
            checkpoint_id = saved.get("checkpoint_id") if isinstance(saved, dict) else getattr(saved, "checkpoint_id", None)
            self.state.record_checkpoint(str(checkpoint_id))
            self.state.note(f"saved checkpoint {checkpoint_id}")
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"save failed: {exc.message}")
        finally:
            self.save_button.disabled = False

    # rendering ----------------------------------------------------------------------------------
    def render(self) -> None:
        """State -> traits. Runs on the throttle's thread; only sets trait values."""
        snap = self.state.snapshot()
        self.header.value = header_html(snap)
        self.message.value = f'<span style="opacity:.8">{escape(snap.message)}</span>' if snap.message else ""
        self.progress.max = max(snap.total_steps or snap.step, 1)
        self.progress.value = min(snap.step, self.progress.max)
        self.progress.bar_style = BAR_STYLES.get(snap.status, "info")
        self.stats.value = stats_html(snap)
        self.loss_chart.value = loss_chart_svg(snap)
        self.device_chart.value = device_chart_svg(snap)
        self.samples.value = samples_html(snap)
        self.logs.value = logs_html(snap)
        self.cancel_button.disabled = snap.job_status in JOB_TERMINAL
        self.save_button.disabled = snap.job_status in JOB_TERMINAL
        if self._display_handle is not None and snap.status in TERMINAL_WORDS:
            handle, self._display_handle = self._display_handle, None
            handle.update(self)

    def __repr__(self) -> str:
        return job_repr(self.state.snapshot())


# pieces (pure functions of a snapshot, so they are easy to test) --------------------------------
def job_repr(snap: Snapshot) -> str:
    """Short and stable: status, step, loss. Frontends cut text/plain reprs at 110 characters."""
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    text = f"<cortex job {snap.job_id} {snap.status} step {snap.step}{total}"
    if snap.last_loss is not None:
        text += f" loss {snap.last_loss:.4f}"
    return text + ">"


def open_in_sidebar_html(job_id: str) -> str:
    """A button the JupyterLab extension picks up by class and data attribute."""
    return (
        f'<button class="{OPEN_IN_SIDEBAR_CLASS} jupyter-button" data-cortex-open-job="{escape(job_id, quote=True)}"'
        ' title="Open this job in the Cortex sidebar">Open in sidebar</button>'
    )


def header_html(snap: Snapshot) -> str:
    color = BADGE_COLORS.get(snap.status, "#6b7280")
    parts = [f"<b>{escape(snap.job_id)}</b>"]
    if snap.name:
        parts.append(escape(snap.name))
    parts.append(f"model <code>{escape(snap.model or '?')}</code>")
    parts.append(f"device <code>{escape(', '.join(snap.devices) or '-')}</code>")
    badge = (f'<span class="cortex-status" style="background:{color};color:white;border-radius:8px;'
             f'padding:1px 8px">{escape(snap.status)}</span>')
    detail = f' <span style="opacity:.7">{escape(snap.detail)}</span>' if snap.detail else ""
    return " · ".join(parts) + " " + badge + detail


def stats_html(snap: Snapshot) -> str:
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    parts = [f"step {snap.step}{total}"]
    if snap.eta_s is not None:
        parts.append(f"ETA {format_duration(snap.eta_s)}")
    elif snap.elapsed_s is not None and snap.status in TERMINAL_WORDS:
        parts.append(f"took {format_duration(snap.elapsed_s)}")
    if snap.tokens_per_s:
        parts.append(f"{format_count(snap.tokens_per_s)} tok/s")
    if snap.last_loss is not None:
        parts.append(f"loss {snap.last_loss:.4f}")
    if snap.last_eval is not None:
        parts.append(f"eval {snap.last_eval:.4f}")
    if snap.checkpoints:
        parts.append(f"checkpoint {escape(snap.checkpoints[-1])}")
    return '<span style="padding-left:8px">' + " · ".join(parts) + "</span>"


def loss_chart_svg(snap: Snapshot) -> str:
    lines = [Line("train", COLORS["train"], snap.loss), Line("eval", COLORS["eval"], snap.eval_loss, dashed=True)]
    return line_chart("loss per token", lines, x_label="step", empty_text="waiting for the first step")


def device_chart_svg(snap: Snapshot) -> str:
    if snap.metric_kind == "gpu":
        lines = [Line("GPU util %", COLORS["util"], snap.metrics.get("gpu_utilization_percent", [])),
                 Line("memory %", COLORS["memory"], snap.metrics.get("gpu_memory_percent", []))]
        title = "GPU"
    else:
        lines = [Line("CPU %", COLORS["util"], snap.metrics.get("cpu_percent", [])),
                 Line("RAM %", COLORS["memory"], snap.metrics.get("ram_percent", []))]
        title = "CPU / RAM (no GPU)" if snap.metric_kind == "cpu" else "device"
    shown = snap.metrics_device or ", ".join(snap.devices)
    devices = f" {shown}" if shown else ""
    return line_chart(title + devices, lines, x_label="seconds", y_range=(0.0, 100.0),
                      empty_text=snap.metrics_note or "waiting for device metrics")


def samples_html(snap: Snapshot) -> str:
    if not snap.samples:
        return ""
    rows = "".join(
        f"<tr><td style='opacity:.7'>{escape(prompt)}</td><td><code>{escape(text)}</code></td></tr>"
        for prompt, text in snap.samples
    )
    return f"<details open><summary>samples at step {snap.samples_step}</summary><table>{rows}</table></details>"


def logs_html(snap: Snapshot) -> str:
    lines = snap.log_tail[-LOG_LINES_SHOWN:]
    dropped = f" ({snap.logs_dropped} older lines dropped by the backend)" if snap.logs_dropped else ""
    body = escape("\n".join(lines)) if lines else "no log lines yet"
    return (
        f"<details><summary>log tail: last {len(lines)} lines{dropped}</summary>"
        f'<pre style="max-height:14em;overflow:auto;font-size:11px;margin:0">{body}</pre></details>'
    )


def remember_widget(widget: JobWidget) -> None:
    _WIDGETS[widget.state.job_id] = widget
    _WIDGETS.move_to_end(widget.state.job_id)
    while len(_WIDGETS) > MAX_REMEMBERED_WIDGETS:
        _WIDGETS.popitem(last=False)


def show_job(client: Client, job_id: str, save_supported: bool = False) -> JobWidget:
    """Display a live widget for an existing job.

    In the kernel that shows (or showed) it, the same widget appears again: one state, one feed.
    Otherwise, as after a kernel restart, it is built from the backend: the job's progress record
    (steps, loss and eval curves, samples, ETA), the log tail and device metrics.
    """
    widget = _WIDGETS.get(job_id)
    if widget is not None and widget.comm is not None:
        display(widget)
        if not widget.state.finished:
            widget.feed.start(capture_parent())
        return widget
    job = client.get_job(job_id)
    state = JobState(job_id, job.get("name"))
    state.set_job(job)
    widget = JobWidget(client, state, save_supported)
    remember_widget(widget)
    return widget.show()
