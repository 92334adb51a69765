"""The live job widget: header, progress, loss and device charts, samples, log tail, buttons.

A background feed (`JobFeed`: the job's progress record from the backend, logs, metrics) only writes
the `JobState`; a `RenderThrottle` turns state into trait values at most 4 times a second (and again
when a relative time or a countdown changes by itself). Widgets are created on the main thread, at
display, where the cell's parent message is captured for the threads.

What the user opens or toggles (the log tail, the samples, the log scale) lives in widget models the
renderer never writes, so a re-render keeps it. When the job has ended, each display of the widget
is replaced by a static HTML picture of the final state, which a saved notebook keeps.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from html import escape
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
from IPython.display import HTML, display, update_display

from ..errors import CortexError
from ..job_feed import JobFeed
from ..job_state import JobState, Snapshot
from ..kernel_threads import capture_parent, start_thread
from ..protocol.states import CELL_DISPLAY_LABEL, JOB_RUNNING
from .job_view import (
    ViewOptions,
    bar_style,
    continued_html,
    device_chart_svg,
    device_note_html,
    header_html,
    job_repr,
    logs_pre,
    logs_title,
    loss_chart_svg,
    message_html,
    mismatch_chart_svg,
    open_in_sidebar_html,
    refresh_in,
    samples_table,
    samples_title,
    static_html,
    stats_html,
    trained,
)
from .throttle import RenderThrottle

if TYPE_CHECKING:
    from ..client import Client

MAX_REMEMBERED_WIDGETS = 32
# The figures of a state's detail (a countdown, a queue position): left out of when to rewrite a picture.
_FIGURES = re.compile(r"\d+")
# The words `%cortex notify on` says (a run ended, failed, or waits for a device).
NOTIFY_WORDS = frozenset({"done", "stopped", "failed", "cancelled", "queued"})
# While the job has ended but the feed still collects its last lines, look again this soon.
FINAL_ROUND_S = 0.5
CHART_LAYOUT = {"flex": "1 1 320px", "min_width": "240px", "max_width": "580px"}

_WIDGETS: OrderedDict[str, JobWidget] = OrderedDict()


def disclosure(title: str, body: widgets.Widget, open_: bool) -> widgets.Accordion:
    """One collapsible section whose open state is the widget model's (the user's), not the HTML's."""
    return widgets.Accordion(children=[body], titles=(title,), selected_index=0 if open_ else None)


class JobWidget(widgets.VBox):
    """A live view of one job. Display it; it follows the backend's record of the job."""

    def __init__(self, client: Client, state: JobState) -> None:
        self.client = client
        self.state = state
        self.header = widgets.HTML()
        self.message = widgets.HTML()
        self.progress = widgets.IntProgress(min=0, max=1, value=0, layout=widgets.Layout(width="320px"))
        self.stats = widgets.HTML()
        self.loss_chart = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.log_scale = widgets.ToggleButton(
            value=False,
            description="log scale",
            icon="line-chart",
            tooltip="Draw the loss on a logarithmic axis",
            layout=widgets.Layout(width="auto", align_self="flex-start"),
        )
        self.device_chart = widgets.HTML(layout=widgets.Layout(width="100%"))
        # Shown once an RL loss reports the sampler-trainer gap.
        self.mismatch_chart = widgets.HTML(layout=widgets.Layout(**CHART_LAYOUT, display="none"))
        self.device_note = widgets.HTML()
        self.samples_body = widgets.HTML()
        self.samples = disclosure("samples", self.samples_body, open_=True)
        self.samples.layout.display = "none"
        self.logs_body = widgets.HTML()
        self.logs = disclosure("log tail", self.logs_body, open_=False)
        self.cancel_button = widgets.Button(
            description="Cancel",
            icon="stop",
            button_style="danger",
            tooltip="Stop this job now; nothing more is saved",
        )
        self.cancel_button.on_click(self._on_cancel)
        # Once training is over the job only holds its device: freeing it is the action, and it keeps
        # the adapter (the backend saves checkpoint "final" first when steps are unsaved).
        self.free_button = widgets.Button(
            description="Free device",
            icon="eject",
            tooltip="End the job and free its device; unsaved trained steps are saved"
            " as checkpoint 'final' first",
            layout=widgets.Layout(display="none"),
        )
        self.free_button.on_click(self._on_free)
        self.confirm_text = widgets.HTML()
        self.stop_and_save_button = widgets.Button(
            description="Stop and save",
            icon="save",
            button_style="primary",
            tooltip="Stop after the step in hand and keep the adapter"
            " (checkpoint 'final'), freeing the device",
        )
        self.stop_and_save_button.on_click(self._on_free)
        self.confirm_button = widgets.Button(
            description="Cancel and discard",
            button_style="danger",
            tooltip="Stop the job now; the trained steps since the last checkpoint are lost",
        )
        self.confirm_button.on_click(self._on_confirm_cancel)
        self.keep_button = widgets.Button(description="Keep training", tooltip="Do not cancel")
        self.keep_button.on_click(self._on_keep)
        self.confirm = widgets.HBox(
            [self.confirm_text, self.stop_and_save_button, self.confirm_button, self.keep_button],
            layout=widgets.Layout(display="none", align_items="center", flex_flow="row wrap"),
        )
        self.save_button = widgets.Button(
            description="Save checkpoint", icon="save", tooltip="Save a resumable checkpoint now"
        )
        self.save_button.on_click(self._on_save)
        self.open_in_sidebar = widgets.HTML(open_in_sidebar_html(state.job_id))
        buttons = [self.cancel_button, self.free_button] + [self.save_button] + [self.open_in_sidebar]
        charts = widgets.HBox(
            [
                widgets.VBox([self.loss_chart, self.log_scale], layout=widgets.Layout(**CHART_LAYOUT)),
                widgets.VBox([self.device_chart, self.device_note], layout=widgets.Layout(**CHART_LAYOUT)),
                self.mismatch_chart,
            ],
            layout=widgets.Layout(flex_flow="row wrap", width="100%"),
        )
        super().__init__(
            children=[
                self.header,
                self.message,
                widgets.HBox([self.progress, self.stats], layout=widgets.Layout(flex_flow="row wrap")),
                charts,
                self.samples,
                self.logs,
                self.confirm,
                widgets.HBox(buttons),
            ]
        )
        self.add_class("cortex-job-widget")
        self.feed = JobFeed(client, state)
        self.throttle = RenderThrottle(self.render, self._finished)
        self.action_errors: list[str] = []
        self._live_displays: list[Any] = []
        # The display of the cell that first showed this run, when that was in an earlier kernel: its
        # record follows this widget ("continued in cell N"). `continued_in` is this cell's number.
        self.origin_display: str | None = None
        self.continued_in: int | None = None
        self._picture_moment: tuple[Any, ...] | None = None
        self._notified_word: str | None = state.snapshot().status
        self.log_scale.observe(lambda _change: self.throttle.mark_dirty(), "value")
        self.logs.observe(self._on_logs_toggled, "selected_index")
        state.subscribe(self.throttle.mark_dirty)
        self.render()

    # life cycle ---------------------------------------------------------------------------------
    def show(self) -> JobWidget:
        """Display under the current cell and follow the job; the parent is captured here.

        Shown again (as `%cortex job ID` does in the kernel that showed it), it is the same widget:
        one state, one feed."""
        parent = capture_parent()
        self.throttle.parent = parent
        snap = self.state.snapshot()
        handle = display(self, display_id=True)
        if parent:  # in a kernel: this display's picture follows the run, and replaces it once it ended
            self._live_displays.append(handle)
            self._picture_moment = self.picture_moment(snap)
            self._find_origin(snap, handle.display_id)
        if not self.state.finished or self.feed.rounds == 0:  # a finished job still needs one round
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

    def settle(self, timeout_s: float = 30.0) -> None:
        """For blocking cells: once the job has ended, wait for the feed's last round and the final
        render, so the static picture replaces the widget while the cell still runs (a notebook
        runner keeps only what arrives then)."""
        if self.state.finished:
            self.feed.join(timeout_s)
        self.throttle.mark_dirty()
        self.throttle.flush(timeout_s)

    def _on_logs_toggled(self, change: dict[str, Any]) -> None:
        """The feed reads the log often only while the user looks at it."""
        self.state.logs_open = change["new"] == 0
        if self.state.logs_open:
            self.feed.read_logs_next_round()

    # what a saved notebook keeps -----------------------------------------------------------------
    def view_options(self) -> ViewOptions:
        return ViewOptions(
            log_scale=self.log_scale.value,
            samples_open=self.samples.selected_index == 0,
            logs_open=self.logs.selected_index == 0,
        )

    def static_html(self) -> str:
        return static_html(self.state.snapshot(), self.view_options())

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view, and next to it a static picture for frontends without the widget model."""
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        bundle["text/html"] = self.static_html()
        return bundle

    def picture_moment(self, snap: Snapshot) -> tuple[Any, ...]:
        """What makes the cell's static picture worth rewriting: the state word and its reason, and each
        tenth of the planned steps (a few rewrites per run: each one re-creates the widget's view). The
        detail counts without its figures: a keep-alive countdown or a queue estimate moves every second,
        and a rewrite each second would rebuild the view under the user's hand."""
        total = snap.total_steps or 0
        progress = snap.step * 10 // total if total else snap.step // 100
        detail = _FIGURES.sub("#", snap.detail) if snap.detail and snap.status != "training" else None
        return (snap.status, detail, progress, snap.message)

    def _refresh_pictures(self, snap: Snapshot) -> None:
        """Rewrite each live display's bundle: the same widget view, and next to it a picture of now, so
        a notebook saved (or a kernel lost) mid-run keeps where the run was, not how it started."""
        moment = self.picture_moment(snap)
        if moment == self._picture_moment or not self._live_displays:
            return
        self._picture_moment = moment
        for handle in self._live_displays:
            handle.update(self)
        self._update_origin(snap)

    def _find_origin(self, snap: Snapshot, display_id: str) -> None:
        """The first display of a run records its id with the job (a label); a widget for the same run
        in a later kernel finds it there and keeps that cell's record pointing here."""
        if self.origin_display is not None:  # shown before: the origin is known
            return
        labels = dict(snap.job.get("labels") or {})
        origin = labels.get(CELL_DISPLAY_LABEL)
        if origin is None:
            try:
                self.client.api.update_job(
                    self.state.job_id, labels={**labels, CELL_DISPLAY_LABEL: display_id}
                )
            except CortexError:  # a job this token may not relabel: its record just stays where it is
                pass
            self.origin_display = display_id
            return
        self.origin_display = origin
        if origin != display_id:
            self.continued_in = cell_number()
            self._update_origin(snap)

    def _update_origin(self, snap: Snapshot) -> None:
        """Rewrite the first cell's record: continued in this cell, with the picture of now (or the end).
        Frontends that forgot the display id at the restart ignore it; that record then keeps its note
        naming `%cortex job ID`."""
        if self.continued_in is None or self.origin_display is None:
            return
        bundle = {
            "text/html": continued_html(snap, self.view_options(), self.continued_in),
            "text/plain": f"{job_repr(snap)} (continued in cell {self.continued_in})",
        }
        update_display(bundle, display_id=self.origin_display, raw=True)

    def _notify(self, snap: Snapshot) -> None:
        """With `%cortex notify on`: one note in the cell when the run ends, fails or starts waiting."""
        from ..magics.registry import notify_enabled

        word = snap.status
        if word == self._notified_word or not self._live_displays:
            return
        self._notified_word = word
        if not notify_enabled() or word not in NOTIFY_WORDS:
            return
        detail = f" {snap.detail}" if snap.detail else ""
        display(
            HTML(
                f'<div class="cortex-notice">cortex: {escape(snap.name or snap.job_id)} {escape(word)}{escape(detail)}</div>'
            )
        )

    def _freeze_displays(self) -> None:
        """Replace each live display by the final static picture (a trusted notebook reopened without
        this kernel would otherwise show "model not found" where the widget was)."""
        displays, self._live_displays = self._live_displays, []
        bundle = {"text/html": self.static_html(), "text/plain": repr(self)}
        for handle in displays:
            handle.update(bundle, raw=True)
        self._update_origin(self.state.snapshot())

    # buttons ------------------------------------------------------------------------------------
    def _on_cancel(self, _button: Any = None) -> None:
        """Cancel at once when nothing trained would be lost; otherwise ask first."""
        unsaved = unsaved_steps(self.state.snapshot())
        if unsaved:
            self.confirm_text.value = escape(cancel_warning(self.state.snapshot(), unsaved))
            self.confirm.layout.display = "flex"
            return
        self._start_cancel()

    def _on_free(self, _button: Any = None) -> None:
        """Free device (`POST /v1/jobs/{id}/complete`), from a helper thread."""
        self.confirm.layout.display = "none"
        self.free_button.disabled = self.cancel_button.disabled = True
        self.state.note("freeing the device…")
        start_thread(self._free, f"cortex-free-{self.state.job_id}", self.throttle.parent)

    def _free(self) -> None:
        try:
            reply = self.client.complete_job(self.state.job_id)
            saved = reply.pop("saved_checkpoint", None)
            self.state.set_job(reply)
            # Said once the backend has answered, so the final picture reads as what happened.
            self.state.note(
                f"device freed; the adapter was saved as checkpoint {saved!r} first"
                if saved
                else "device freed"
            )
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"free device failed: {exc.message}")
            self.free_button.disabled = self.cancel_button.disabled = False
        if not self.feed.alive:
            self.feed.start(self.throttle.parent)

    def _on_confirm_cancel(self, _button: Any = None) -> None:
        self.confirm.layout.display = "none"
        self._start_cancel()

    def _on_keep(self, _button: Any = None) -> None:
        self.confirm.layout.display = "none"

    def _start_cancel(self) -> None:
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
            checkpoint_id = (
                saved.get("checkpoint_id")
                if isinstance(saved, dict)
                else getattr(saved, "checkpoint_id", None)
            )
            self.state.record_checkpoint(str(checkpoint_id))
            self.state.note(f"saved checkpoint {checkpoint_id}")
        except CortexError as exc:
            self.action_errors.append(str(exc))
            self.state.note(f"save failed: {exc.message}")
        finally:
            self.save_button.disabled = False

    # rendering ----------------------------------------------------------------------------------
    def render(self) -> float | None:
        """State -> traits. Runs on the throttle's thread; only sets trait values. Returns when the
        view changes by itself next (seconds), for the throttle."""
        now = time.time()
        snap = self.state.snapshot()
        self.header.value = header_html(snap)
        self.message.value = message_html(snap)
        self.progress.max = max(snap.total_steps or snap.step, 1)
        self.progress.value = min(snap.step, self.progress.max)
        self.progress.bar_style = bar_style(snap)
        self.stats.value = stats_html(snap, now)
        self.loss_chart.value = loss_chart_svg(snap, self.log_scale.value)
        self.device_chart.value = device_chart_svg(snap)
        if snap.mismatch:
            self.mismatch_chart.value = mismatch_chart_svg(snap)
            self.mismatch_chart.layout.display = None
        self.device_note.value = device_note_html(snap)
        if snap.samples:
            self.samples_body.value = samples_table(snap)
            self.samples.titles = (samples_title(snap),)
            self.samples.layout.display = None
        self.logs_body.value = logs_pre(snap)
        self.logs.titles = (logs_title(snap),)
        finished = snap.finished
        free = trained(snap)
        self.cancel_button.layout.display = "none" if finished or free else None
        self.free_button.layout.display = None if free else "none"
        self.save_button.disabled = finished
        if finished or free:
            self.confirm.layout.display = "none"
        if snap.finished:
            self._notify(snap)
            if self._finished():
                self._freeze_displays()
                return None
            return FINAL_ROUND_S
        self._refresh_pictures(snap)
        self._notify(snap)
        return refresh_in(snap, now)

    def __repr__(self) -> str:
        return job_repr(self.state.snapshot())


def unsaved_steps(snap: Snapshot) -> int:
    """Trained steps a cancel would throw away: those after the last checkpoint the backend reports."""
    if snap.job_status != JOB_RUNNING or snap.step <= 0:
        return 0
    progress = snap.job.get("progress") or {}
    saved_at = progress.get("last_checkpoint_step")
    if saved_at is not None:
        return max(snap.step - int(saved_at), 0)
    return snap.step


def cancel_warning(snap: Snapshot, unsaved: int) -> str:
    last = (snap.job.get("progress") or {}).get("last_checkpoint") or (
        snap.checkpoints[-1] if snap.checkpoints else None
    )
    since = f"since checkpoint {last}" if last else "and no checkpoint was saved"
    return (
        f"Cancel stops the job now and discards {unsaved} trained step{'s' if unsaved != 1 else ''} {since}. "
        "Save a checkpoint first to keep them."
    )


def cell_number() -> int | None:
    """The number of the cell running now (its `In [N]`), or None outside IPython. Read from the input
    history, which holds the cell before it runs: IPython 9 has already counted past it by then, 8 not."""
    from IPython import get_ipython

    history = getattr(getattr(get_ipython(), "history_manager", None), "input_hist_parsed", None)
    return len(history) - 1 if history else None


def remember_widget(widget: JobWidget) -> None:
    _WIDGETS[widget.state.job_id] = widget
    _WIDGETS.move_to_end(widget.state.job_id)
    while len(_WIDGETS) > MAX_REMEMBERED_WIDGETS:
        _WIDGETS.popitem(last=False)


def show_job(client: Client, job_id: str) -> JobWidget:
    """Display a live widget for an existing job.

    In the kernel that shows (or showed) it, the same widget appears again: one state, one feed.
    Otherwise, as after a kernel restart, it is built from the backend: the job's progress record
    (steps, loss and eval curves, samples, ETA), the log tail and device metrics.
    """
    widget = _WIDGETS.get(job_id)
    if widget is not None and widget.comm is not None:
        return widget.show()
    job = client.get_job(job_id)
    state = JobState(job_id, job.get("name"))
    state.set_job(job)
    widget = JobWidget(client, state)
    remember_widget(widget)
    return widget.show()
